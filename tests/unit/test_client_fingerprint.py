"""A partition's fingerprint: the same for equal parts whatever their dtype, pinned,
different when one index moves or a boundary between clients moves; its record keeps
each client's size and label counts and reads back from its JSON."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from thrift_trainer.training.clients.fingerprint import PartitionRecord, fingerprint, record_of
from thrift_trainer.training.clients.partitioners import partition

LABELS = np.repeat(np.arange(4), 25)
PARTS = [np.array([0, 3, 7]), np.array([1, 2]), np.array([4, 5, 6, 8])]


def test_the_fingerprint_is_sha256_of_lengths_and_int64_little_endian_indices() -> None:
    expected = hashlib.sha256()
    expected.update((3).to_bytes(8, "little"))
    for part in PARTS:
        expected.update(len(part).to_bytes(8, "little"))
        for index in part:
            expected.update(int(index).to_bytes(8, "little", signed=True))
    assert fingerprint(PARTS) == "sha256:" + expected.hexdigest()


def test_equal_parts_give_one_fingerprint_whatever_their_dtype() -> None:
    as_int32 = [part.astype(np.int32) for part in PARTS]
    as_big_endian = [part.astype(">i8") for part in PARTS]
    as_lists = [part.tolist() for part in PARTS]
    assert fingerprint(PARTS) == fingerprint(as_int32) == fingerprint(as_big_endian) \
        == fingerprint(as_lists)


def test_the_fingerprint_changes_when_one_index_or_one_boundary_moves() -> None:
    moved = [np.array([0, 3]), np.array([1, 2, 7]), PARTS[2]]  # index 7 to client 1
    shifted = [np.array([0, 3, 7, 1]), np.array([2]), PARTS[2]]  # same order, new boundary
    swapped = [PARTS[1], PARTS[0], PARTS[2]]
    prints = {fingerprint(parts) for parts in (PARTS, moved, shifted, swapped)}
    assert len(prints) == 4


def test_the_fingerprint_of_known_parts_is_pinned() -> None:
    """Written down once: a process, platform or numpy version that computed another
    value would not recognise a partition it had recorded."""
    assert fingerprint(PARTS) == ("sha256:23c24c9f05f1dbb8b5b8b2eb2b6f38c7"
                                  "010b5cfbd24a571b0d29dee3f9619111")


def test_the_record_keeps_sizes_and_label_counts_and_reads_back_from_json() -> None:
    parts = partition("shards", LABELS, 4, seed=1, shards_per_client=1)
    record = record_of(parts, LABELS, "shards", 1, shards_per_client=1)
    assert record.clients == 4 and record.sizes == [25] * 4
    assert sorted(tuple(counts.items()) for counts in record.label_counts) == \
        [((0, 25),), ((1, 25),), ((2, 25),), ((3, 25),)]
    text = record.to_json()
    data = json.loads(text)
    assert data["fingerprint"] == fingerprint(parts) and data["partitioner"] == "shards"
    assert data["params"] == {"shards_per_client": 1}
    assert PartitionRecord.from_json(text) == record
