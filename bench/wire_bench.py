"""Throughput of one float32 tensor sent one way, through three paths, in one run.

1. raw: loopback TCP between two Python processes, sendmsg / recv_into into a
   preallocated buffer (the ceiling for Python on this machine);
2. thrift: our ComputeNode service (wire.rpc + wire.transport) called with a
   WorkRequest carrying the tensor in `weights`; the server decodes it with
   `from_wire` and returns a small TrainResult;
3. list<double>: the same tensor as a Thrift `list<double>`, with stock
   Thrift's fastest path for lists (C-accelerated binary protocol, framed
   transport), `.tolist()` / `np.array` included. The struct comes from a tiny
   IDL compiled with the `thrift` compiler into a temporary folder.

Each server runs in its own process on 127.0.0.1; the client is this process.
Times run from the first byte sent to the reply received; MiB/s counts tensor
bytes (float32), whatever the path puts on the wire. Every server process is
ended by its PID before the script exits.

With `--big`, payloads of 256 MiB, 1 GiB and 4 GiB (or `--big-sizes-mib`) go through
paths 1 and 2 only (list<double> would take minutes and gigabytes): ours travels in
chunks (wire/chunks.py), and the table adds the peak resident memory of the sender
(this process) and the receiver beyond the tensor itself, read from /proc after
resetting each process's peak (`/proc/PID/clear_refs`).

    python bench/wire_bench.py [--size-mib 16] [--reps 7] [--warmup 1]
    python bench/wire_bench.py --big [--reps 3] [--big-sizes-mib 256,1024,4096]
"""

from __future__ import annotations

import argparse
import os
import platform
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devtools.machine import cpu_model  # noqa: E402
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, ttypes  # noqa: E402
from thrift_trainer.wire.rpc import ThriftServer, connect  # noqa: E402
from thrift_trainer.wire.tensor_codec import from_wire, to_wire  # noqa: E402
from thrift_trainer.wire.transport import tune_socket  # noqa: E402

THRIFT_COMPILER = "/usr/bin/thrift"
LIST_IDL = """
namespace py list_bench
struct DoubleList { 1: required list<double> values }
service ListSink { i64 put(1: DoubleList values) }
"""
RAW_HEADER = struct.Struct("!Q")
SERVER_START_SECONDS = 30.0
CALL_TIMEOUT_SECONDS = 120.0
LIST_MAX_FRAME = 2**30 - 1  # the largest frame stock Thrift accepts

Sender = Callable[[np.ndarray], None]


# ------------------------------------------------------------------ servers
def serve_raw(max_bytes: int) -> None:
    """Receive length-prefixed blobs into one preallocated buffer; ack each with b"k"."""
    listener = socket.create_server(("127.0.0.1", 0))
    announce(listener.getsockname()[1])
    conn, _ = listener.accept()
    tune_socket(conn)
    buf = memoryview(bytearray(max_bytes))
    header = memoryview(bytearray(RAW_HEADER.size))
    while recv_exactly(conn, header):
        (size,) = RAW_HEADER.unpack(header)
        if not recv_exactly(conn, buf[:size]):
            return
        conn.sendall(b"k")


def recv_exactly(conn: socket.socket, view: memoryview) -> bool:
    """Fill `view`; False if the peer closed first."""
    pos = 0
    while pos < len(view):
        got = conn.recv_into(view[pos:])
        if not got:
            return False
        pos += got
    return True


class DecodingNode:
    """ComputeNode handler that decodes the weights and answers with a small result."""

    def train_with_weights(self, request: ttypes.WorkRequest) -> ttypes.TrainResult:
        w = from_wire(request.weights[0])
        return ttypes.TrainResult(
            accepted=True,
            outcome=ttypes.UnitOutcome.COMPLETED,
            update=[],
            num_samples=w.size,
            loss=float(w[0]),
            error=float(w[-1]),
            compute_seconds=0.0,
            delay_seconds=0.0,
        )


def serve_thrift() -> None:
    """Our ComputeNode server; SIGTERM stops it cleanly."""
    server = ThriftServer(ComputeNode.Processor(DecodingNode()))
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    announce(server.port)
    server.serve_forever()


def serve_list(gen_dir: str) -> None:
    """Stock Thrift server taking a list<double> with the C codec, framed transport."""
    sys.path.insert(0, gen_dir)
    from list_bench import ListSink
    from thrift.protocol.TBinaryProtocol import TBinaryProtocolAcceleratedFactory
    from thrift.transport.TSocket import TServerSocket
    from thrift.transport.TTransport import TFramedTransport, TTransportException

    class Sink:
        def put(self, values: object) -> int:
            return int(np.array(values.values, dtype=np.float32).size)

    listener = TServerSocket(host="127.0.0.1", port=0)
    listener.listen()  # TSimpleServer would listen again on a new port, so serve by hand
    announce(listener.handle.getsockname()[1])
    processor = ListSink.Processor(Sink())
    protocols = TBinaryProtocolAcceleratedFactory(container_length_limit=2**28)
    transport = TFramedTransport(listener.accept(), max_frame_size=LIST_MAX_FRAME)
    protocol = protocols.getProtocol(transport)
    with suppress(TTransportException):  # the client hung up
        while True:
            processor.process(protocol, protocol)


def announce(port: int) -> None:
    print(f"PORT {port}", flush=True)


# ------------------------------------------------------------------ clients
def raw_sender(port: int) -> tuple[Sender, Callable[[], None]]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=CALL_TIMEOUT_SECONDS)
    tune_socket(sock)

    def send(arr: np.ndarray) -> None:
        data = memoryview(arr.reshape(-1).view(np.uint8))
        views = [memoryview(RAW_HEADER.pack(data.nbytes)), data]
        while views:
            sent = sock.sendmsg(views)
            while views and sent >= views[0].nbytes:
                sent -= views.pop(0).nbytes
            if sent:
                views[0] = views[0][sent:]
        if sock.recv(1) != b"k":
            raise RuntimeError("raw server did not acknowledge")

    return send, sock.close


def thrift_sender(port: int) -> tuple[Sender, Callable[[], None]]:
    session = connect(ComputeNode.Client, "127.0.0.1", port, read_timeout=CALL_TIMEOUT_SECONDS)
    client = session.__enter__()

    def send(arr: np.ndarray) -> None:
        result = client.train_with_weights(work_request(arr))
        if result.num_samples != arr.size or result.error != float(arr.reshape(-1)[-1]):
            raise RuntimeError("thrift server decoded something else")

    return send, lambda: session.__exit__(None, None, None)


def work_request(arr: np.ndarray) -> ttypes.WorkRequest:
    return ttypes.WorkRequest(
        protocol_version=PROTOCOL_VERSION,
        run_id="bench",
        round=0,
        unit_id="u0",
        attempt=1,
        algorithm="delta_avg",
        model="mlp",
        dataset="bench",
        unit_path="unit-0",
        config_json="{}",
        weights=[to_wire("w", arr)],
        scheduling_policy=1,
    )


def list_sender(port: int, gen_dir: str) -> tuple[Sender, Callable[[], None]]:
    sys.path.insert(0, gen_dir)
    from list_bench import ListSink
    from list_bench.ttypes import DoubleList
    from thrift.protocol.TBinaryProtocol import TBinaryProtocolAccelerated
    from thrift.transport.TSocket import TSocket
    from thrift.transport.TTransport import TFramedTransport

    sock = TSocket("127.0.0.1", port)
    sock.setTimeout(CALL_TIMEOUT_SECONDS * 1000)
    transport = TFramedTransport(sock, max_frame_size=LIST_MAX_FRAME)
    transport.open()
    client = ListSink.Client(TBinaryProtocolAccelerated(transport))

    def send(arr: np.ndarray) -> None:
        if client.put(DoubleList(values=arr.astype(np.float64).ravel().tolist())) != arr.size:
            raise RuntimeError("list server received something else")

    return send, transport.close


# ---------------------------------------------------------------- plumbing
def start_server(args: list[str]) -> tuple[subprocess.Popen[str], int]:
    """Start `python wire_bench.py --serve ...` and wait (bounded) for its port."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", *args], stdout=subprocess.PIPE, text=True
    )
    ready, _, _ = select.select([proc.stdout], [], [], SERVER_START_SECONDS)
    line = proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
    if not line.startswith("PORT "):
        stop_process(proc)
        raise RuntimeError(f"server {args} did not start: {line!r}")
    return proc, int(line.split()[1])


def stop_process(proc: subprocess.Popen[str]) -> None:
    """End a server we started, by its PID: SIGTERM, then SIGKILL after 5 s."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    if proc.stdout is not None:
        proc.stdout.close()


def compile_list_idl(folder: str) -> str:
    """Compile the list<double> IDL with the thrift compiler; return the gen-py folder."""
    idl = Path(folder, "list_bench.thrift")
    idl.write_text(LIST_IDL)
    subprocess.run(
        [THRIFT_COMPILER, "--gen", "py", "-out", folder, str(idl)], check=True, timeout=60
    )
    return folder


def measure(send: Sender, arr: np.ndarray, reps: int, warmup: int) -> float:
    """Median MiB/s of `reps` timed sends after `warmup` untimed ones."""
    for _ in range(warmup):
        send(arr)
    seconds = []
    for _ in range(reps):
        start = time.perf_counter()
        send(arr)
        seconds.append(time.perf_counter() - start)
    return arr.nbytes / 2**20 / statistics.median(seconds)


def run_path(
    server_args: list[str],
    make_sender: Callable[[int], tuple[Sender, Callable[[], None]]],
    arr: np.ndarray,
    reps: int,
    warmup: int,
    memory: dict[str, int] | None = None,
) -> float:
    """MiB/s of one path; with `memory`, also fills in the peak resident bytes of the
    receiver and of this process during the timed sends beyond what they held before."""
    proc, port = start_server(server_args)
    try:
        send, close = make_sender(port)
        try:
            if memory is None:
                return measure(send, arr, reps, warmup)
            send(arr)  # warm: connections, imports, the first buffers
            before = {"receiver": reset_peak(proc.pid), "sender": reset_peak(os.getpid())}
            speed = measure(send, arr, reps, warmup=0)
            memory["receiver"] = peak_bytes(proc.pid) - before["receiver"]
            memory["sender"] = peak_bytes(os.getpid()) - before["sender"]
            return speed
        finally:
            close()
    finally:
        stop_process(proc)


def reset_peak(pid: int) -> int:
    """Make the process's peak resident size its current one; returns that size."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _status_kib(pid, "VmRSS") * 1024


def peak_bytes(pid: int) -> int:
    return _status_kib(pid, "VmHWM") * 1024


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {key}")


def machine() -> str:
    import thrift

    cpu = cpu_model()
    thrift_version = getattr(thrift, "__version__", None) or _dist_version("thrift")
    return (
        f"nproc {os.cpu_count()}, {cpu}, Python {platform.python_version()}, "
        f"thrift {thrift_version}, numpy {np.__version__}"
    )


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def table(size_mib: float, reps: int, results: dict[str, float]) -> str:
    raw = results["raw"]
    ours = results["thrift"]
    labels = {
        "raw": "raw loopback TCP (sendmsg / recv_into, preallocated buffer)",
        "thrift": "our Thrift service: `binary` Tensor in WorkRequest (wire/)",
        "list": "`list<double>`, stock Thrift C codec, framed (`.tolist()` included)",
    }
    lines = [
        f"| path, one {size_mib:g} MiB float32 tensor one way, median of {reps} | MiB/s | x raw |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {labels[k]} | {v:,.0f} | {v / raw:.3f} |" for k, v in results.items()]
    lines.append(f"\nours / list<double>: {ours / results['list']:.1f}x")
    return "\n".join(lines)


def big_table(reps: int, rows: list[tuple[int, float, float, dict[str, int]]]) -> str:
    lines = [f"| payload | raw MiB/s | ours MiB/s | x raw | sender peak beyond the tensor "
             f"| receiver peak beyond the tensor |  (median of {reps})",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for size_mib, raw, ours, memory in rows:
        beyond = memory["receiver"] - size_mib * 2**20  # the received tensor itself
        lines.append(f"| {size_mib:,} MiB | {raw:,.0f} | {ours:,.0f} | {ours / raw:.2f} | "
                     f"{memory['sender'] / 2**20:,.1f} MiB | {beyond / 2**20:,.1f} MiB |")
    return "\n".join(lines)


def run_big(sizes_mib: list[int], reps: int) -> str:
    """Raw against ours, chunked, at each size; peak memory beyond the tensor."""
    rows = []
    for size_mib in sizes_mib:
        arr = np.ones(size_mib * 2**18, dtype=np.float32)  # touched: resident before timing
        raw = run_path(["raw", str(arr.nbytes)], raw_sender, arr, reps, 1)
        memory: dict[str, int] = {}
        ours = run_path(["thrift"], thrift_sender, arr, reps, 0, memory)
        rows.append((size_mib, raw, ours, memory))
        print(f"{size_mib} MiB: raw {raw:,.0f} MiB/s, ours {ours:,.0f} MiB/s", flush=True)
        del arr
    return big_table(reps, rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=float, default=16.0, help="tensor size (default 16)")
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions (default 7)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed sends first (default 1)")
    parser.add_argument("--big", action="store_true",
                        help="payloads of 256 MiB, 1 GiB and 4 GiB, raw against ours (in "
                             "chunks), with peak memory")
    parser.add_argument("--big-sizes-mib", default="256,1024,4096",
                        help="the payloads of --big, in MiB (default %(default)s)")
    parser.add_argument("--serve", nargs="+", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def serve(args: list[str]) -> None:
    kind = args[0]
    if kind == "raw":
        serve_raw(int(args[1]))
    elif kind == "thrift":
        serve_thrift()
    else:
        serve_list(args[1])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.serve:
        serve(args.serve)
        return
    if args.big:
        sizes = [int(size) for size in args.big_sizes_mib.split(",")]
        print(machine())
        print(run_big(sizes, args.reps))
        return
    arr = np.random.default_rng(0).random(int(args.size_mib * 2**18), dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="wire_bench_") as tmp:
        gen_dir = compile_list_idl(tmp)
        results = {
            "raw": run_path(["raw", str(arr.nbytes)], raw_sender, arr, args.reps, args.warmup),
            "thrift": run_path(["thrift"], thrift_sender, arr, args.reps, args.warmup),
            "list": run_path(
                ["list", gen_dir],
                lambda port: list_sender(port, gen_dir),
                arr,
                args.reps,
                args.warmup,
            ),
        }
    print(machine())
    print(table(args.size_mib, args.reps, results))


if __name__ == "__main__":
    main()
