"""The warning a server prints when it answers anyone on the network: listening beyond
loopback without a token."""

from __future__ import annotations

import pytest

from thrift_trainer.wire.launch import exposure_warning


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.5", "node7.example"])
def test_a_server_beyond_loopback_without_a_token_is_warned_about(host: str) -> None:
    line = exposure_warning([(host, 9091)], token=None)
    assert line is not None and "\n" not in line
    assert "without a token" in line and "--token-file" in line and "9091" in line
    assert "listening on" not in line  # what scripts read the bound port from


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_a_server_on_loopback_alone_is_not(host: str) -> None:
    assert exposure_warning([(host, 9091)], token=None) is None


def test_a_server_that_requires_a_token_is_not() -> None:
    assert exposure_warning([("0.0.0.0", 9091)], token="secret") is None


def test_one_line_names_every_exposed_port_of_the_process() -> None:
    line = exposure_warning([("0.0.0.0", 9091), ("0.0.0.0", 9092), ("127.0.0.1", 8080)],
                            token=None)
    assert line is not None and "9091" in line and "9092" in line and "8080" not in line
