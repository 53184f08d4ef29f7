#!/usr/bin/env python3
"""Train the letters MLP through a coordinator with the stock Thrift library for Python.

Only the `thrift` package and the generated code in gen-py/ are used (nothing else of
this repository), as a client in any other language would (docs/clients.md):

    pip install thrift           # the Python library (requirements.txt pins the version)
    python examples/python/train.py <coordinator_host> <port> [--rounds N] [--config JSON]
        [--token-file PATH] [--tls-ca PATH]

train() blocks for the whole run on one connection, without a read timeout; this script
follows the run with status() on a second one and prints the final metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import threading
import time
import uuid
from pathlib import Path

from thrift.protocol import TBinaryProtocol
from thrift.transport import TSocket, TSSLSocket, TTransport

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gen-py"))
from trainer_rpc import Coordinator, ttypes  # noqa: E402 - generated code, found via gen-py/
from trainer_rpc.constants import PROTOCOL_VERSION  # noqa: E402

# The README's recommended letters run (config.yaml's delta_avg section).
DEFAULT_CONFIG = {"epochs": 5, "hidden": [128, 128], "eta": 0.005, "scale_features": True,
                  "local_optimizer": "adam", "server_optimizer": "momentum",
                  "server_momentum": 0.5}
# numpy dtype name -> struct format; every tensor is C-order and little-endian.
FORMATS = {"float16": "e", "float32": "f", "float64": "d", "int8": "b", "int16": "h",
           "int32": "i", "int64": "q", "uint8": "B", "bool": "?"}
STATUS_TIMEOUT = 5.0  # seconds a status call may take
DEAD_AFTER = 15.0  # give up when status has not answered for this long


def connect(args: argparse.Namespace, timeout: float | None) -> Coordinator.Client:
    """A client over a framed, binary-protocol connection; TLS when a CA is given."""
    if args.tls_ca:
        sock = TSSLSocket.TSSLSocket(args.host, args.port, ca_certs=args.tls_ca)
    else:
        sock = TSocket.TSocket(args.host, args.port)
    sock.setTimeout(None if timeout is None else timeout * 1000)  # milliseconds
    transport = TTransport.TFramedTransport(sock)
    transport.open()
    return Coordinator.Client(TBinaryProtocol.TBinaryProtocol(transport))


def close(client: Coordinator.Client) -> None:
    client._iprot.trans.close()


def decode(tensor: ttypes.Tensor) -> tuple[list[int], tuple]:
    """The shape and the values (flat, C order) of a Tensor."""
    count = 1
    for n in tensor.shape:
        count *= n
    return list(tensor.shape), struct.unpack(f"<{count}{FORMATS[tensor.dtype]}", tensor.data)


def train(args: argparse.Namespace, token: str | None) -> ttypes.RunResult:
    request = ttypes.TrainRequest(
        protocol_version=PROTOCOL_VERSION, run_id=uuid.uuid4().hex[:12], algorithm="delta_avg",
        model="mlp", dataset="letters", rounds=args.rounds, config_json=json.dumps(args.config),
        token=token)
    control = connect(args, STATUS_TIMEOUT)
    try:
        control.ping(ttypes.PingRequest(protocol_version=PROTOCOL_VERSION, token=token))
    finally:
        close(control)
    outcome: dict[str, object] = {}

    def blocking_train() -> None:
        client = connect(args, None)  # no read timeout: train() answers when the run ends
        try:
            outcome["result"] = client.train(request)
        except Exception as exc:  # noqa: BLE001 - handed to the main thread
            outcome["error"] = exc
        finally:
            close(client)

    thread = threading.Thread(target=blocking_train, daemon=True)
    thread.start()
    follow(args, request.run_id, token, thread)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def follow(args: argparse.Namespace, run_id: str, token: str | None,
           thread: threading.Thread) -> None:
    """Print progress, from status() on a connection of its own, until train() returns;
    give up when the coordinator has not answered for DEAD_AFTER seconds."""
    control, last_answer, shown = None, time.monotonic(), ""
    while thread.is_alive():
        thread.join(1.0)
        try:
            control = control or connect(args, STATUS_TIMEOUT)
            status = control.status(ttypes.StatusRequest(run_id=run_id, token=token))
            last_answer = time.monotonic()
        except ttypes.UnknownRun:
            last_answer = time.monotonic()  # answered: the run is not registered yet
            continue
        except Exception as exc:  # noqa: BLE001 - a broken connection: open another
            if control is not None:
                close(control)
            control = None
            if time.monotonic() - last_answer > DEAD_AFTER:
                raise RuntimeError(f"lost contact with the coordinator ({exc}); run {run_id} "
                                   "may still be going on there") from None
            continue
        line = f"round {status.round}/{status.rounds}  validation error " \
               f"{status.validation_error:.4f}"
        if line != shown:
            print(line, flush=True)
        shown = line
    if control is not None:
        close(control)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--config", type=json.loads, default=DEFAULT_CONFIG,
                        help="config_json: keys of config.yaml's delta_avg section")
    parser.add_argument("--token-file", help="the shared token (else TRAINER_TOKEN)")
    parser.add_argument("--tls-ca", help="CA certificate: connect with TLS")
    args = parser.parse_args()
    token = (Path(args.token_file).read_text().strip() if args.token_file
             else os.environ.get("TRAINER_TOKEN"))
    try:
        result = train(args, token)
    except Exception as exc:  # noqa: BLE001 - one line, as a command should
        print(f"error: {getattr(exc, 'message', None) or exc}", file=sys.stderr)
        return 1
    print(f"Final validation error: {result.validation_error:.4f}")
    print(f"Rounds: {result.rounds}   Wall time: {result.wall_seconds:.1f} s   "
          f"Run: {result.run_id}")
    for node in result.nodes:
        print(f"{node.node}  accepted {node.accepted}  rejected {node.rejected}  "
              f"samples {node.samples or 0}")
    for tensor in result.weights:
        shape, values = decode(tensor)
        print(f"weights {tensor.name} {tensor.dtype} {shape} mean |w| "
              f"{sum(abs(v) for v in values) / max(len(values), 1):.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
