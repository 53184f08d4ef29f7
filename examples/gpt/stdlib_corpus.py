"""Real text with no download: a byte corpus of Python standard-library sources, as a
trainer plug-in data set (``stdlib_corpus:stdlib_text``).

The corpus is a fixed, sorted list of modules (`SOURCES`) read from the running
interpreter's standard library and concatenated. Each process writes it once under its
data root (``<root>/stdlib_corpus/stdlib.txt``) and reads that file afterwards; its
`fingerprint` is the SHA-256 of the bytes. A node whose Python ships other sources (another
version, a patched build) makes another corpus, so its fingerprint differs from the
coordinator's and the trainer leaves it out of the run with one line; copying the
coordinator's ``stdlib.txt`` into the node's data root makes the copies agree.

Items are fixed windows of the corpus: ``x = bytes[i:i+T]``, ``y = bytes[i+1:i+T+1]``
(T = ``block_size``), starting every T bytes; the last 5 % of the corpus is the validation
part. The training windows come in a fixed shuffled order (the same on every process),
so a work unit, a range of item indices, samples the whole corpus rather than one module.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
import tempfile
from pathlib import Path

import numpy as np
import torch

__version__ = "1.0"

# Modules present in every CPython from 3.9 to 3.13, sorted; about 2 MB in 3.11.
SOURCES = (
    "argparse.py", "ast.py", "base64.py", "bisect.py", "calendar.py", "cmd.py", "codecs.py",
    "collections/__init__.py", "configparser.py", "contextlib.py", "copy.py", "csv.py",
    "dataclasses.py", "difflib.py", "enum.py", "fnmatch.py", "fractions.py",
    "functools.py", "getopt.py", "glob.py", "gzip.py", "heapq.py", "inspect.py",
    "ipaddress.py", "json/__init__.py", "json/decoder.py", "json/encoder.py",
    "logging/__init__.py", "optparse.py", "pickle.py", "pprint.py", "queue.py", "random.py",
    "sched.py", "shlex.py", "shutil.py", "statistics.py", "string.py", "subprocess.py",
    "tarfile.py", "tempfile.py", "textwrap.py", "threading.py", "tokenize.py",
    "traceback.py", "typing.py", "uuid.py", "warnings.py", "weakref.py",
)
FOLDER = "stdlib_corpus"
FILE = "stdlib.txt"
VALIDATION_SHARE = 0.05  # the corpus's last bytes held out for validation
ORDER_SEED = 0


def stdlib_folder() -> Path:
    """The running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def build_corpus(stdlib: Path | None = None) -> bytes:
    """The `SOURCES` of ``stdlib`` (default: this interpreter's), concatenated in order."""
    folder = stdlib if stdlib is not None else stdlib_folder()
    missing = [name for name in SOURCES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"the standard library at {folder} has no {missing[0]}")
    return b"".join((folder / name).read_bytes() for name in SOURCES)


def corpus(root: Path) -> bytes:
    """The corpus under data root ``root``, written there first if it is not yet (written
    to a temporary file and renamed, so processes sharing a data root never read half a
    file)."""
    path = Path(root) / FOLDER / FILE
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{FILE}.")
        with os.fdopen(handle, "wb") as out:
            out.write(build_corpus())
        os.replace(temporary, path)
    return path.read_bytes()


class ByteWindows:
    """Windows of ``block_size`` + 1 bytes of ``text``: item k is (x, y), the window's
    first T bytes and its last T, as int64 tensors."""

    num_classes = 256  # every byte value: the trainer need not scan the targets

    def __init__(self, text: bytes, block_size: int, digest: str, shuffle: bool) -> None:
        if block_size < 1 or len(text) <= block_size:
            raise ValueError(f"block_size {block_size} does not fit {len(text):,} bytes")
        self.block_size = block_size
        self.bytes = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        self.starts = np.arange((len(text) - 1) // block_size) * block_size
        if shuffle:
            self.starts = np.random.default_rng(ORDER_SEED).permutation(self.starts)
        self.digest = digest

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = int(self.starts[index])
        window = self.bytes[start:start + self.block_size + 1].long()
        return window[:-1], window[1:]

    def fingerprint(self) -> str:
        """SHA-256 of the whole corpus: equal on every process that holds the same bytes."""
        return self.digest


def stdlib_text(root: Path, split: str, block_size: int = 128,
                shuffle: bool = True) -> ByteWindows:
    """The training (``split="train"``) or validation windows of the corpus under ``root``
    (the process's data root). ``shuffle``: the training windows in a fixed shuffled order."""
    text = corpus(root)
    cut = int(len(text) * (1 - VALIDATION_SHARE))
    part = text[:cut] if split == "train" else text[cut:]
    return ByteWindows(part, block_size, hashlib.sha256(text).hexdigest(),
                       shuffle and split == "train")
