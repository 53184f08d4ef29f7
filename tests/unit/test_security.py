"""wire.security: token sources, TLS contexts and the command-line flags."""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

import pytest

from tests.tls_certs import Certs, make_certs
from thrift_trainer.wire import chunks, security
from thrift_trainer.wire.limits import ServerLimits
from thrift_trainer.wire.security import MIB, SecurityError, from_args, read_token_file, token_from


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def parse(argv: list[str], serves: bool = True) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    security.add_arguments(parser, serves=serves)
    return parser.parse_args(argv)


# ----------------------------------------------------------------- tokens
def test_token_file_is_read_and_stripped(tmp_path: Path):
    path = tmp_path / "token"
    path.write_text("  abc123\n\n")
    assert read_token_file(str(path)) == "abc123"


@pytest.mark.parametrize("content, message", [(None, "does not exist"), (" \n", "is empty")])
def test_missing_or_empty_token_file_is_a_clear_error(tmp_path: Path, content, message):
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SecurityError, match=message) as info:
        read_token_file(str(path))
    assert str(path) in str(info.value)


def test_token_file_wins_over_the_environment(tmp_path: Path):
    path = tmp_path / "token"
    path.write_text("from-file\n")
    assert token_from(str(path), {"TRAINER_TOKEN": "from-env"}) == "from-file"
    assert token_from(None, {"TRAINER_TOKEN": " from-env\n"}) == "from-env"
    assert token_from(None, {}) is None


def test_an_empty_environment_token_is_an_error():
    with pytest.raises(SecurityError, match="TRAINER_TOKEN is set but empty"):
        token_from(None, {"TRAINER_TOKEN": "  "})


def test_describe_never_shows_the_token():
    described = security.Security(token="very-secret").describe()
    assert "very-secret" not in described and "token required" in described


# ------------------------------------------------------------------ flags
def test_flags_build_the_settings(tmp_path: Path, certs: Certs, monkeypatch):
    monkeypatch.delenv("TRAINER_TOKEN", raising=False)
    token = tmp_path / "token"
    token.write_text("t0k3n\n")
    settings = from_args(parse(["--token-file", str(token), "--tls-cert", str(certs.cert),
                                "--tls-key", str(certs.key), "--tls-ca", str(certs.ca),
                                "--max-frame-mb", "64"]), serves=True)
    assert settings.token == "t0k3n"
    assert isinstance(settings.server_tls, ssl.SSLContext)
    assert settings.client_tls is not None and settings.client_tls.check_hostname
    assert settings.max_frame_bytes == 64 * MIB


def test_no_flags_mean_no_token_no_tls_and_256_mib(monkeypatch):
    monkeypatch.delenv("TRAINER_TOKEN", raising=False)
    settings = from_args(parse([]), serves=True)
    assert settings == security.Security(max_frame_bytes=256 * MIB)


@pytest.mark.parametrize("flags, message", [
    (["--tls-cert", "CERT"], "go together"),
    (["--tls-key", "KEY"], "go together"),
    (["--tls-cert", "CERT", "--tls-key", "KEY"], "needs --tls-ca"),
    (["--tls-cert", "CA", "--tls-key", "KEY", "--tls-ca", "CA"], "cannot load TLS certificate"),
    (["--tls-cert", "MISSING", "--tls-key", "KEY", "--tls-ca", "CA"], "not found"),
    (["--tls-ca", "MISSING"], "does not exist"),
    (["--tls-ca", "KEY"], "cannot load TLS CA"),
])
def test_bad_tls_flags_are_clear_errors(certs: Certs, tmp_path: Path, flags, message):
    files = {"CERT": certs.cert, "KEY": certs.key, "CA": certs.ca,
             "MISSING": tmp_path / "missing.pem"}
    argv = [str(files.get(flag, flag)) for flag in flags]
    with pytest.raises(SecurityError, match=message):
        from_args(parse(argv), serves=True)


@pytest.mark.parametrize("value", ["0", "2048", "ten", "1.5"])
def test_max_frame_mb_out_of_range_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as info:
        parse(["--max-frame-mb", value])
    assert info.value.code == 2
    assert "--max-frame-mb" in capsys.readouterr().err


def test_a_client_has_no_server_flags():
    with pytest.raises(SystemExit):
        parse(["--tls-cert", "x"], serves=False)


def test_configure_from_args_sets_the_process_default(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(security, "_current", security.Security())  # restored afterwards
    token = tmp_path / "token"
    token.write_text("abc")
    assert security.configure_from_args(parse(["--token-file", str(token)]), serves=True) is None
    assert security.current().token == "abc"
    problem = security.configure_from_args(parse(["--token-file", str(tmp_path / "no")]),
                                           serves=True)
    assert problem is not None and "does not exist" in problem
    assert security.current().token == "abc"  # a failed configuration changes nothing


# ----------------------------------------------------------- server limits
def test_server_limit_flags_build_the_limits(monkeypatch):
    monkeypatch.delenv(security.TOKEN_ENV, raising=False)
    limits = from_args(parse(["--idle-timeout", "0", "--frame-timeout", "30",
                              "--max-connections", "50", "--max-connections-per-peer", "5",
                              "--max-pending-frames-mb", "300"]), serves=True).limits
    assert limits == ServerLimits(idle_timeout=None, frame_timeout=30.0, max_connections=50,
                                  max_connections_per_peer=5, pending_frame_bytes=300 * MIB)
    assert from_args(parse([]), serves=True).limits == ServerLimits()


def test_a_pending_frame_budget_below_the_frame_limit_is_an_error(monkeypatch):
    monkeypatch.delenv(security.TOKEN_ENV, raising=False)
    args = parse(["--max-frame-mb", "64", "--max-pending-frames-mb", "32"])
    with pytest.raises(SecurityError, match="--max-pending-frames-mb .32. must be at least"):
        from_args(args, serves=True)


@pytest.mark.parametrize("flag, value", [("--frame-timeout", "0"), ("--idle-timeout", "-1"),
                                         ("--max-connections", "0"),
                                         ("--max-connections-per-peer", "x")])
def test_bad_server_limits_are_usage_errors(flag, value, capsys):
    with pytest.raises(SystemExit) as info:
        parse([flag, value])
    assert info.value.code == 2
    assert flag in capsys.readouterr().err


def test_a_client_has_no_server_limit_flags():
    with pytest.raises(SystemExit):
        parse(["--max-connections", "3"], serves=False)


# ------------------------------------------------------------- big messages
def test_chunks_default_to_4_mib_or_just_under_a_smaller_frame_limit(monkeypatch):
    monkeypatch.delenv(security.TOKEN_ENV, raising=False)
    assert from_args(parse([]), serves=True).messages.chunk_bytes == 4 * MIB
    small = from_args(parse(["--max-frame-mb", "1"]), serves=True).messages
    assert small.chunk_bytes == MIB - chunks.DATA_HEAD_BYTES  # a chunk and its head: a frame
    chosen = from_args(parse(["--chunk-mb", "0.5", "--max-message-mb", "100"]), serves=False)
    assert (chosen.messages.chunk_bytes, chosen.messages.max_message_bytes) == (MIB // 2,
                                                                                100 * MIB)


def test_chunks_that_do_not_fit_this_processs_frames_are_an_error(monkeypatch):
    monkeypatch.delenv(security.TOKEN_ENV, raising=False)
    with pytest.raises(SecurityError, match=r"--chunk-mb \(8\) must be under --max-frame-mb "
                                            r"\(4\): every chunk is a frame"):
        from_args(parse(["--chunk-mb", "8", "--max-frame-mb", "4"]), serves=True)


@pytest.mark.parametrize("value", ["0.01", "0", "x"])
def test_chunks_under_64_kib_are_a_usage_error(value, capsys):
    with pytest.raises(SystemExit):
        parse(["--chunk-mb", value])
    assert "--chunk-mb" in capsys.readouterr().err
