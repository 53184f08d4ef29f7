"""examples/gpt: the standard-library corpus (a fixed list, the same bytes and fingerprint
every time, windows shifted by one) and the GPT's shapes, causality and size."""

from __future__ import annotations

import hashlib
import sys

import pytest
import torch

from devtools.local_cluster import REPO

sys.path.insert(0, str(REPO / "examples" / "gpt"))

import gpt_model  # noqa: E402
import stdlib_corpus  # noqa: E402

TINY = {"block_size": 16, "d_model": 32, "n_layer": 2, "n_head": 2}


def test_the_corpus_is_a_fixed_sorted_list_of_this_pythons_standard_library():
    assert list(stdlib_corpus.SOURCES) == sorted(set(stdlib_corpus.SOURCES))
    text = stdlib_corpus.build_corpus()
    folder = stdlib_corpus.stdlib_folder()
    assert text == b"".join((folder / name).read_bytes() for name in stdlib_corpus.SOURCES)
    assert 500_000 < len(text) < 10_000_000


def test_the_corpus_is_written_once_and_gives_the_same_fingerprint_every_time(tmp_path):
    first = stdlib_corpus.stdlib_text(tmp_path / "a", "train")
    again = stdlib_corpus.stdlib_text(tmp_path / "a", "validation")
    elsewhere = stdlib_corpus.stdlib_text(tmp_path / "b", "train")
    written = (tmp_path / "a" / stdlib_corpus.FOLDER / stdlib_corpus.FILE).read_bytes()
    assert written == stdlib_corpus.build_corpus()
    assert first.fingerprint() == again.fingerprint() == elsewhere.fingerprint() \
        == hashlib.sha256(written).hexdigest()
    assert [name.name for name in (tmp_path / "a" / stdlib_corpus.FOLDER).iterdir()] \
        == [stdlib_corpus.FILE]  # no temporary file left behind


def test_other_bytes_under_the_data_root_give_another_fingerprint(tmp_path):
    """What a node with another Python's sources holds: its copy is told apart."""
    same = stdlib_corpus.stdlib_text(tmp_path / "a", "train")
    other = tmp_path / "b" / stdlib_corpus.FOLDER / stdlib_corpus.FILE
    other.parent.mkdir(parents=True)
    other.write_bytes(stdlib_corpus.build_corpus().replace(b"import", b"imports", 1))
    assert stdlib_corpus.stdlib_text(tmp_path / "b", "train").fingerprint() \
        != same.fingerprint()


def test_a_standard_library_without_a_listed_module_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=stdlib_corpus.SOURCES[0]):
        stdlib_corpus.build_corpus(tmp_path)


def test_items_are_windows_and_their_next_bytes(tmp_path):
    text = stdlib_corpus.corpus(tmp_path)
    cut = int(len(text) * (1 - stdlib_corpus.VALIDATION_SHARE))
    for split, part in (("train", text[:cut]), ("validation", text[cut:])):
        data = stdlib_corpus.stdlib_text(tmp_path, split, block_size=64)
        assert len(data) == (len(part) - 1) // 64
        for index in (0, len(data) // 2, len(data) - 1):
            x, y = data[index]
            assert x.shape == y.shape == (64,) and x.dtype == y.dtype == torch.int64
            start = int(data.starts[index])
            assert bytes(x.tolist()) == part[start:start + 64]
            assert bytes(y.tolist()) == part[start + 1:start + 65]  # shifted by one


def test_the_training_windows_come_in_a_fixed_shuffled_order(tmp_path):
    train = stdlib_corpus.stdlib_text(tmp_path, "train")
    again = stdlib_corpus.stdlib_text(tmp_path, "train")
    validation = stdlib_corpus.stdlib_text(tmp_path, "validation")
    assert (train.starts == again.starts).all()
    assert sorted(train.starts) == list(range(0, 128 * len(train), 128))
    assert list(train.starts[:5]) != list(range(0, 5 * 128, 128))
    assert list(validation.starts) == list(range(0, 128 * len(validation), 128))


def test_the_model_scores_every_position_and_each_sees_only_the_past():
    model = gpt_model.GPT(**TINY).eval()
    tokens = torch.randint(0, 256, (3, 16))
    scores = model(tokens)
    assert scores.shape == (3, 16, 256)
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    with torch.no_grad():
        after = model(changed)
    assert torch.equal(after[:, :10], scores[:, :10].detach())
    assert not torch.allclose(after[:, 10:], scores[:, 10:].detach())
    assert model(tokens[:, :5]).shape == (3, 5, 256)  # shorter than the context
    with pytest.raises(ValueError, match="context"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_the_default_model_has_1_to_10_million_parameters_and_no_shared_tensors():
    model = gpt_model.GPT()
    assert 1_000_000 <= sum(p.numel() for p in model.parameters()) <= 10_000_000
    state = model.state_dict()
    assert len({t.data_ptr() for t in state.values()}) == len(state)
    assert list(state) == [name for name, _ in model.named_parameters()]  # no buffers


def test_sampling_continues_the_prompt():
    model = gpt_model.GPT(**TINY)
    text = gpt_model.sample(model, b"def ", 20, seed=3)
    assert text.startswith(b"def ") and len(text) == 24
    assert text == gpt_model.sample(model, b"def ", 20, seed=3)
    assert len(gpt_model.sample(model, b"", 5)) == 5
