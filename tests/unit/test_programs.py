"""A test that needs a program this machine lacks skips here, and fails under CI."""

from __future__ import annotations

import pytest

from tests.programs import missing_commands, require


def test_a_missing_program_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs nodejs .apt-get install nodejs."):
        require(["nodejs"], "apt-get install nodejs")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        require(["nodejs"], "apt-get install nodejs")


@pytest.mark.parametrize("ci", ["true", "1"])
def test_a_missing_program_fails_under_ci(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match="needs chromium .*; under CI no test skips"):
        require(["chromium"], "scripts/setup.sh installs it")


def test_nothing_missing_lets_the_test_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    require([], "unused")
    assert missing_commands("sh", "no-such-program-x9") == ["no-such-program-x9"]
