"""Which clients a node holds: ``--clients 0-49,60,70-79`` (client indices, ranges
inclusive). A node started without it holds every client of a partitioned run."""

from __future__ import annotations

import re

from thrift_trainer.training.clients.settings import MAX_CLIENTS, client_name

_PART = re.compile(r"(\d+)(?:-(\d+))?")
MAX_RANGES = 1_000  # pieces one --clients may list


class HeldClients:
    """The client indices a node holds, as inclusive ranges."""

    def __init__(self, ranges: list[tuple[int, int]]) -> None:
        self.ranges = sorted(ranges)

    @classmethod
    def parse(cls, text: str) -> HeldClients:
        """``0-49,60``; ValueError names what is wrong."""
        parts = [part.strip() for part in text.split(",")]
        if not text.strip() or len(parts) > MAX_RANGES:
            raise ValueError(f"expected client indices such as 0-49,60 (at most {MAX_RANGES} "
                             f"pieces), got {text!r}")
        ranges = []
        for part in parts:
            match = _PART.fullmatch(part)
            if match is None:
                raise ValueError(f"expected an index or a range LOW-HIGH, got {part!r}")
            low = int(match.group(1))
            high = int(match.group(2)) if match.group(2) is not None else low
            if high < low or high >= MAX_CLIENTS:
                raise ValueError(f"range {part!r} must go up, below {MAX_CLIENTS}")
            ranges.append((low, high))
        return cls(ranges)

    def __contains__(self, index: int) -> bool:
        return any(low <= index <= high for low, high in self.ranges)

    def names(self, count: int) -> list[str]:
        """The names of the held clients among a run's ``count``, in index order."""
        return [client_name(k) for low, high in self.ranges
                for k in range(low, min(high, count - 1) + 1)]

    def __str__(self) -> str:
        return ",".join(f"{low}-{high}" if high > low else str(low)
                        for low, high in self.ranges)
