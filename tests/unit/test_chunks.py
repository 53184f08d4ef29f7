"""The chunk protocol's frames and checks (wire.chunks), without sockets."""

from __future__ import annotations

import struct

import pytest

from thrift_trainer.wire import chunks
from thrift_trainer.wire.chunks import ChunkSequenceError, Receipt

PEER = "127.0.0.1:9091"
_WORD = struct.Struct("!I")


def data_frame(seq: int, total: int, payload: int) -> tuple[int, bytes]:
    """(length word, head) of a DATA frame."""
    header = chunks.data_header(seq, total, payload)
    return _WORD.unpack_from(header)[0], header[4:]


def receive(receipt: Receipt, seq: int, total: int, payload: int) -> tuple[int, int]:
    word, head = data_frame(seq, total, payload)
    return receipt.check_head(head, receipt.check_word(word))


def test_an_announcement_round_trips_total_chunk_and_token() -> None:
    frame = chunks.announce(5 * 2**30, 4 * 2**20, "s3cret")
    (word,) = _WORD.unpack_from(frame)
    assert word & chunks.CHUNK_FLAG
    assert word & chunks.LENGTH_MASK == len(frame) - 4
    assert chunks.parse_announce(frame[4:], PEER) == (5 * 2**30, 4 * 2**20, b"s3cret")


def test_an_answer_is_the_chunk_size_taken_or_the_refusal_s_reason() -> None:
    assert chunks.parse_answer(chunks.acceptance(4096)[4:], PEER, 8192).chunk == 4096
    assert chunks.parse_answer(chunks.refusal("too big")[4:], PEER, 8192).refused == "too big"
    with pytest.raises(ChunkSequenceError, match="answered an announcement with a chunk"):
        chunks.parse_answer(chunks.data_header(1, 10, 10)[4:], PEER, 8192)
    with pytest.raises(ChunkSequenceError, match="accepted chunks of 9000 bytes where chunks "
                                                 "of at most 8192 were announced"):
        chunks.parse_answer(chunks.acceptance(9000)[4:], PEER, 8192)


def test_a_frame_that_is_no_announcement_is_refused() -> None:
    with pytest.raises(ChunkSequenceError, match="sent an acceptance frame where a message"):
        chunks.parse_announce(chunks.acceptance(4096)[4:], PEER)
    truncated = chunks.announce(100, 64, "token")[4:-2]
    with pytest.raises(ChunkSequenceError, match="token length"):
        chunks.parse_announce(truncated, PEER)


def test_a_message_is_split_into_chunks_of_slices_of_the_callers_buffers() -> None:
    first, second = bytearray(b"a" * 10), bytearray(b"b" * 7)
    views = [memoryview(first), memoryview(b""), memoryview(second)]
    frames = list(chunks.split(views, 17, 6))
    assert len(frames) == 3
    payloads = [b"".join(bytes(p) for p in frame[1:]) for frame in frames]
    assert payloads == [b"aaaaaa", b"aaaabb", b"bbbbb"]
    for seq, frame in enumerate(frames, 1):
        word, head = _WORD.unpack_from(frame[0])[0], frame[0][4:]
        assert word & chunks.LENGTH_MASK == chunks.DATA_HEAD_BYTES + len(payloads[seq - 1])
        assert struct.unpack("!BIQ", head) == (chunks.DATA, seq, 17)
    first[0] = ord("z")  # the slices are views of the caller's memory, not copies
    assert bytes(frames[0][1])[0] == ord("z")


def test_a_receipt_places_each_chunk_after_the_last() -> None:
    receipt = Receipt(total=10, chunk=4, peer=PEER)
    assert receive(receipt, 1, 10, 4) == (0, 4)
    assert receive(receipt, 2, 10, 4) == (4, 4)
    assert not receipt.complete
    assert receive(receipt, 3, 10, 2) == (8, 2)
    assert receipt.complete


@pytest.mark.parametrize(("frames", "problem"), [
    ([(2, 10, 4)], "chunk 2 came out of order where chunk 1 was due"),
    ([(1, 10, 4), (1, 10, 4)], "chunk 1 came again where chunk 2 was due"),
    ([(1, 10, 4), (3, 10, 2)], "chunk 3 came out of order where chunk 2 was due"),
    ([(1, 12, 4)], "chunk 1 says the message has 12 bytes"),
    ([(1, 10, 3)], "chunk 1 carries 3 bytes where 4 were due"),
    ([(1, 10, 4), (2, 10, 4), (3, 10, 4)], "chunk 3 carries 4 bytes where 2 were due"),
])
def test_a_broken_chunk_sequence_is_refused(frames: list[tuple[int, int, int]],
                                            problem: str) -> None:
    receipt = Receipt(total=10, chunk=4, peer=PEER)
    with pytest.raises(ChunkSequenceError) as refused:
        for frame in frames:
            receive(receipt, *frame)
    assert problem in str(refused.value)
    assert "the message is dropped and the connection closed" in str(refused.value)


def test_a_missing_chunk_is_refused_when_another_frame_comes_instead() -> None:
    receipt = Receipt(total=10, chunk=4, peer=PEER)
    receive(receipt, 1, 10, 4)
    with pytest.raises(ChunkSequenceError, match="after 4: chunk 2 is missing: an ordinary"):
        receipt.check_word(120)  # an ordinary frame's length word
    announcement = _WORD.unpack_from(chunks.announce(10, 4, None))[0]
    size = receipt.check_word(announcement)
    with pytest.raises(ChunkSequenceError, match="chunk 2 is missing: an announcement"):
        receipt.check_head(chunks.announce(10, 4, None)[4:4 + chunks.DATA_HEAD_BYTES], size)


def test_a_call_header_says_whether_its_caller_reads_chunked_replies() -> None:
    plain = struct.pack("!I", 0x8001_0001)
    flagged = struct.pack("!I", 0x8001_0001 | chunks.CHUNKED_REPLIES)
    assert not chunks.reads_chunked_replies(plain + b"rest")
    assert chunks.reads_chunked_replies(flagged + b"rest")
    assert not chunks.reads_chunked_replies(struct.pack("!I", 0x0000_0101) + b"old style")
    assert not chunks.reads_chunked_replies(b"")


def test_sizes_read_as_people_read_them() -> None:
    assert chunks.size_text(270435181) == "257.9 MiB (270435181 bytes)"
    assert chunks.size_text(5 * 2**30) == "5.00 GiB (5368709120 bytes)"
    assert chunks.limit_text(64 * 2**20) == "64"
