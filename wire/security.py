"""Process-wide connection settings: the shared token, TLS, the frame size and server limits.

Each command builds a `Security` from its flags (`add_arguments`, `from_args`) and calls
`configure` once at start-up. From then on every server and every connection the process
opens (coordinator to nodes, node to node, node to coordinator, client to coordinator)
uses it, unless a constructor is given its own token, TLS context or limit, which is how
tests run servers with different settings in one process.
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

from thrift_trainer.wire import arg_types, chunks
from thrift_trainer.wire.chunks import MessageLimits
from thrift_trainer.wire.limits import ServerLimits
from thrift_trainer.wire.transport import DEFAULT_MAX_FRAME_BYTES

log = logging.getLogger(__name__)

MIB = 1024 * 1024
MAX_FRAME_MB_LIMIT = 2047  # a frame's signed 32-bit length field says at most 2 GiB - 1
TOKEN_ENV = "TRAINER_TOKEN"


class SecurityError(Exception):
    """Unusable security settings; the message names the flag or file to fix."""


@dataclass(frozen=True)
class Security:
    """What servers and connections use when not told otherwise.

    token: required of every call received and sent with every call made (None: neither).
    server_tls: wraps accepted connections (None: plaintext).
    client_tls: wraps opened connections and verifies the server (None: plaintext).
    max_frame_bytes: largest frame accepted or sent.
    limits: what each server grants its peers (timeouts, connections, frame memory).
    messages: the chunk size of big messages and the largest message accepted.
    """

    token: str | None = None
    server_tls: ssl.SSLContext | None = None
    client_tls: ssl.SSLContext | None = None
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    limits: ServerLimits = field(default_factory=ServerLimits)
    messages: MessageLimits = field(default_factory=MessageLimits)

    def describe(self) -> str:
        """One line for the start-up log; never shows the token itself."""
        return (f"token {'required' if self.token else 'off'}, "
                f"TLS serving {'on' if self.server_tls else 'off'}, "
                f"TLS to peers {'on' if self.client_tls else 'off'}, "
                f"max frame {self.max_frame_bytes / MIB:g} MiB, "
                f"chunks of {self.messages.chunk_bytes / MIB:g} MiB, "
                f"max message {self.messages.max_message_bytes / MIB:g} MiB")


_current = Security()


def configure(security: Security) -> None:
    """Make `security` the default of every server and connection opened from now on."""
    global _current
    _current = security


def current() -> Security:
    """The settings last given to `configure` (no token, no TLS, 256 MiB frames at first)."""
    return _current


# ----------------------------------------------------------------- tokens
def read_token_file(path: str) -> str:
    """The token in `path`, surrounding whitespace (the trailing newline) stripped."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except FileNotFoundError:
        raise SecurityError(f"token file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SecurityError(f"cannot read token file {path}: {exc}") from None
    if not token:
        raise SecurityError(f"token file {path} is empty; put the shared token in it, e.g. "
                            f"openssl rand -hex 32 > {path}")
    return token


def token_from(path: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The token of --token-file, else of $TRAINER_TOKEN, else None (no token)."""
    if path is not None:
        return read_token_file(path)
    if TOKEN_ENV not in environ:
        return None
    token = environ[TOKEN_ENV].strip()
    if not token:
        raise SecurityError(f"{TOKEN_ENV} is set but empty; set it to the shared token "
                            "or unset it to run without one")
    return token


# -------------------------------------------------------------------- TLS
def server_context(cert: str, key: str) -> ssl.SSLContext:
    """A TLS server context presenting `cert` (PEM, may hold the chain) with `key`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except FileNotFoundError as exc:
        raise SecurityError(f"TLS certificate or key file not found: {exc.filename}") from None
    except (ssl.SSLError, OSError) as exc:
        raise SecurityError(f"cannot load TLS certificate {cert} with key {key}: {exc} "
                            "(both PEM, and the key must belong to the certificate)") from None
    return context


def client_context(ca: str) -> ssl.SSLContext:
    """A TLS client context trusting the CA certificates in `ca` and checking host names."""
    try:
        context = ssl.create_default_context(cafile=ca)
    except FileNotFoundError:
        raise SecurityError(f"TLS CA file {ca} does not exist") from None
    except (ssl.SSLError, OSError) as exc:
        raise SecurityError(f"cannot load TLS CA certificates from {ca}: {exc} "
                            "(a PEM file of one or more certificates)") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


# -------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser, *, serves: bool) -> None:
    """The security flags; `serves`: the command is a server (adds --tls-cert, --tls-key)."""
    group = parser.add_argument_group(
        "security and limits",
        "All optional; see docs/deployment.md.")
    group.add_argument(
        "--token-file", metavar="PATH", default=None,
        help="file holding the shared secret token (read once, whitespace stripped). "
             + ("Every call this process receives must carry it and every call it makes "
                "carries it" if serves else "Every call carries it")
             + f"; use the same token everywhere. Default: the {TOKEN_ENV} environment "
               "variable; with neither, no token is sent" + (" or required" if serves else ""))
    if serves:
        group.add_argument(
            "--tls-cert", metavar="PATH", default=None,
            help="serve TLS only, presenting this PEM certificate (it may include the chain); "
                 "needs --tls-key and --tls-ca")
        group.add_argument("--tls-key", metavar="PATH", default=None,
                           help="PEM private key of --tls-cert")
    group.add_argument(
        "--tls-ca", metavar="PATH", default=None,
        help="PEM file of the CA certificate(s) that signed the servers' certificates: "
             "connections this process opens use TLS and check that the server's certificate "
             "is signed by it and names the address dialled")
    group.add_argument(
        "--max-frame-mb", type=arg_types.int_range(1, MAX_FRAME_MB_LIMIT),
        default=DEFAULT_MAX_FRAME_BYTES // MIB, metavar="MB",
        help="largest frame this process accepts or sends, in MiB (default %(default)s); "
             "a bigger frame from a peer is refused before memory is allocated, its "
             "connection closed and an error logged. Messages over 1 MiB travel in chunks "
             "that fit the receiver's frames, so this bounds one frame, not a model")
    group.add_argument(
        "--chunk-mb", type=arg_types.chunk_mb, default=None, metavar="MB",
        help="messages over 1 MiB (weights, updates, results) are announced and sent in "
             "chunks of at most this many MiB, each its own frame; a receiver with smaller "
             "frames takes smaller ones (default "
             f"{chunks.DEFAULT_CHUNK_BYTES / MIB:g}, or just under --max-frame-mb if that is "
             f"smaller; at least {chunks.MIN_CHUNK_BYTES // 1024} KiB, i.e. 0.0625)")
    group.add_argument(
        "--max-message-mb", type=arg_types.positive_float,
        default=chunks.DEFAULT_MAX_MESSAGE_BYTES / MIB, metavar="MB",
        help="largest message this process takes from a peer, in MiB (default: this "
             "machine's memory, %(default).0f); a bigger one is refused when announced, "
             "before it is sent, and the sender is told this limit")
    if serves:
        _add_server_limits(group)


def _add_server_limits(group: argparse._ArgumentGroup) -> None:
    defaults = ServerLimits()
    group.add_argument(
        "--idle-timeout", type=arg_types.non_negative_seconds, default=defaults.idle_timeout,
        metavar="SECONDS",
        help="close a connection on which no request starts for this long (default "
             "%(default)s; 0: never). Pooled connections of peers reconnect transparently")
    group.add_argument(
        "--frame-timeout", type=arg_types.seconds, default=defaults.frame_timeout,
        metavar="SECONDS",
        help="a request must arrive whole within this long of its first byte, else its "
             "connection is closed (default %(default)s); raise it for big models on slow links")
    group.add_argument(
        "--max-connections", type=arg_types.positive_int, default=defaults.max_connections,
        metavar="N",
        help="open connections this server accepts; more are closed at once (default "
             "%(default)s)")
    group.add_argument(
        "--max-connections-per-peer", type=arg_types.positive_int,
        default=defaults.max_connections_per_peer, metavar="N",
        help="open connections accepted from one address (default %(default)s)")
    group.add_argument(
        "--max-pending-frames-mb", type=arg_types.positive_int,
        default=defaults.pending_frame_bytes // MIB, metavar="MB",
        help="MiB that requests still arriving from peers whose token is not yet checked "
             "may claim together; a request waits for room (default %(default)s; at least "
             "--max-frame-mb)")


def from_args(args: argparse.Namespace, *, serves: bool) -> Security:
    """The Security of parsed flags (of `add_arguments`); SecurityError names what is wrong."""
    cert, key = getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
    if serves and (cert is None) != (key is None):
        raise SecurityError("--tls-cert and --tls-key go together: give both to serve TLS")
    if cert is not None and args.tls_ca is None:
        raise SecurityError("--tls-cert needs --tls-ca as well: this process also connects "
                            "to other servers and checks their certificates against that CA")
    return Security(
        token=token_from(args.token_file),
        server_tls=server_context(cert, key) if cert is not None else None,
        client_tls=client_context(args.tls_ca) if args.tls_ca is not None else None,
        max_frame_bytes=args.max_frame_mb * MIB,
        limits=_limits_from(args) if serves else ServerLimits(),
        messages=_messages_from(args),
    )


def _messages_from(args: argparse.Namespace) -> MessageLimits:
    room = args.max_frame_mb * MIB - chunks.DATA_HEAD_BYTES  # a chunk and its head: a frame
    if args.chunk_mb is None:
        chunk = min(chunks.DEFAULT_CHUNK_BYTES, room)
    else:
        chunk = int(args.chunk_mb * MIB)
    if chunk > room:
        raise SecurityError(f"--chunk-mb ({args.chunk_mb:g}) must be under --max-frame-mb "
                            f"({args.max_frame_mb}): every chunk is a frame")
    return MessageLimits(chunk_bytes=chunk, max_message_bytes=int(args.max_message_mb * MIB))


def _limits_from(args: argparse.Namespace) -> ServerLimits:
    if args.max_pending_frames_mb < args.max_frame_mb:
        raise SecurityError(f"--max-pending-frames-mb ({args.max_pending_frames_mb}) must be at "
                            f"least --max-frame-mb ({args.max_frame_mb}), or a request of the "
                            "largest size could never be received")
    return ServerLimits(
        idle_timeout=args.idle_timeout or None,
        frame_timeout=args.frame_timeout,
        max_connections=args.max_connections,
        max_connections_per_peer=args.max_connections_per_peer,
        pending_frame_bytes=args.max_pending_frames_mb * MIB,
    )


def configure_from_args(args: argparse.Namespace, *, serves: bool) -> str | None:
    """`configure` from parsed flags; returns what is wrong with them instead, if anything."""
    try:
        settings = from_args(args, serves=serves)
    except SecurityError as exc:
        return str(exc)
    configure(settings)
    limits = f", {settings.limits.describe()}" if serves else ""
    log.info("connection security: %s%s", settings.describe(), limits)
    return None

