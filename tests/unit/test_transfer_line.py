"""The client's one-line summary of bytes moved and how."""

from __future__ import annotations

from thrift_trainer.client.display import transfer_line


def _line(compression: dict) -> str:
    return transfer_line({"bytes_up": 1_200_000, "bytes_down": 8_400_000,
                          "aggregation": "mean", "compression": compression})


def test_topk_shows_its_fraction_and_warmup() -> None:
    assert _line({"up": "topk", "down": "none", "topk_fraction": 0.01}) == (
        "Bytes up: 1.2 MB  down: 8.4 MB  aggregation: mean  compression: up topk 0.01, "
        "down none")
    assert _line({"up": "topk", "down": "fp16", "topk_fraction": 0.01,
                  "topk_warmup_rounds": 4}).endswith("up topk 0.01 (warm-up 4), down fp16")
    assert _line({"up": "int8", "down": "none", "topk_fraction": 0.01,
                  "topk_warmup_rounds": 4}).endswith("up int8, down none")
