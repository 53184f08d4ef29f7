"""The tensor codec: exact round trips, no copies, clear refusals."""

from __future__ import annotations

import numpy as np
import pytest
from thrift.transport.TTransport import TMemoryBuffer

from thrift_trainer.wire.generated import ttypes
from thrift_trainer.wire.tensor_codec import (
    ALLOWED_DTYPES,
    CodecError,
    dict_to_wire,
    from_wire,
    to_wire,
    wire_to_dict,
)
from thrift_trainer.wire.transport import WireProtocolFactory

RNG = np.random.default_rng(7)


def sample(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == "bool":
        return RNG.random(shape) > 0.5
    if dtype.startswith("float"):
        return RNG.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def through_thrift(t: ttypes.Tensor) -> ttypes.Tensor:
    """Serialise with our protocol to bytes and read back, as the wire would."""
    out = TMemoryBuffer()
    t.write(WireProtocolFactory().getProtocol(out))
    back = ttypes.Tensor()
    back.read(WireProtocolFactory().getProtocol(TMemoryBuffer(out.getvalue())))
    return back


@pytest.mark.parametrize("dtype", sorted(ALLOWED_DTYPES))
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 0, 2), (2, 3, 4)])
def test_round_trip_is_bit_exact(dtype: str, shape: tuple[int, ...]) -> None:
    arr = sample(dtype, shape)
    back = from_wire(through_thrift(to_wire("x", arr)))
    assert back.dtype == arr.dtype
    assert back.shape == arr.shape
    assert back.tobytes() == arr.tobytes()


def test_to_wire_does_not_copy_a_contiguous_array() -> None:
    arr = sample("float32", (64, 32))
    t = to_wire("w", arr)
    assert isinstance(t.data, memoryview)
    assert np.shares_memory(np.frombuffer(t.data, dtype=np.uint8), arr)
    assert (t.name, t.dtype, t.shape) == ("w", "float32", [64, 32])


def test_to_wire_converts_big_endian_and_strided_arrays() -> None:
    arr = sample("float64", (6, 4))
    big_endian = arr.astype(">f8")
    strided = arr[:, ::2]
    assert np.array_equal(from_wire(through_thrift(to_wire("b", big_endian))), arr)
    assert np.array_equal(from_wire(through_thrift(to_wire("s", strided))), strided)


def test_from_wire_is_a_read_only_view_of_the_data() -> None:
    data = bytearray(np.arange(6, dtype="<i4").tobytes())
    arr = from_wire(ttypes.Tensor(name="v", dtype="int32", shape=[2, 3], data=memoryview(data)))
    assert np.shares_memory(arr, np.frombuffer(data, dtype=np.uint8))
    assert not arr.flags.writeable
    assert arr.tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize(
    ("tensor", "words"),
    [
        (ttypes.Tensor(name="a", dtype="complex64", shape=[1], data=b"\0" * 8), "dtype"),
        (ttypes.Tensor(name="a", dtype="object", shape=[1], data=b"\0" * 8), "astype"),
        (ttypes.Tensor(name="a", dtype="float32", shape=[-1], data=b""), "non-negative"),
        (ttypes.Tensor(name="a", dtype="float32", shape=None, data=b""), "shape"),
        (ttypes.Tensor(name="a", dtype="float32", shape=[3], data=b"\0" * 8), "needs 12 bytes"),
        (ttypes.Tensor(name="a", dtype="float32", shape=[2], data=None), "no data"),
    ],
)
def test_from_wire_refuses_bad_tensors_with_a_clear_message(
    tensor: ttypes.Tensor, words: str
) -> None:
    with pytest.raises(CodecError, match=words) as info:
        from_wire(tensor)
    assert "'a'" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_to_wire_refuses_dtypes_the_wire_does_not_carry() -> None:
    with pytest.raises(CodecError, match="complex128"):
        to_wire("z", np.zeros(2, dtype=np.complex128))


def test_dicts_keep_order_and_refuse_duplicate_names() -> None:
    d = {"z": sample("float32", (2,)), "a": sample("int64", (3,)), "m": sample("bool", (1,))}
    ts = dict_to_wire(d)
    assert [t.name for t in ts] == ["z", "a", "m"]
    back = wire_to_dict(through_thrift(t) for t in ts)
    assert list(back) == ["z", "a", "m"]
    assert all(np.array_equal(back[k], d[k]) for k in d)
    with pytest.raises(CodecError, match="twice"):
        wire_to_dict([ts[0], ts[0]])
