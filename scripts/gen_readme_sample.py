#!/usr/bin/env python3
"""Writes the README's sample client output from a real run of the README's own commands.

The commands are read from the README's first code block under "## The three commands":
its `python compute_node.py PORT LOAD` lines, its `python coordinator_node.py PORT POLICY`
line and its `python client.py HOST PORT ...` line. They run as separate processes on
127.0.0.1, on ports the system picks, and the client's output goes between the README's
`sample-output:begin` and `sample-output:end` markers, with the node addresses, ports
and run folder the README's commands would show. tests/e2e/test_readme_sample.py runs
the same commands and checks that their output has the README's shape (`shape`): the
same lines, labels and columns, and the same numbers where timing cannot change them.

Usage: python scripts/gen_readme_sample.py [--check]   (--check: exit 1 if the README differs)
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools import local_cluster  # noqa: E402

README = ROOT / "README.md"
NODES_FILE = ROOT / "compute_nodes.txt"
SECTION = "## The three commands"
BLOCK = re.compile(r"(<!-- sample-output:begin -->\n)(.*?)(<!-- sample-output:end -->)", re.S)
# Where the README's coordinator, started in the repository, keeps its runs.
SHOWN_REPO = "/home/me/thrift-trainer"


@dataclass(frozen=True)
class Commands:
    """The README's quick start: nodes as (port, load), the policy, the client's words."""

    nodes: list[tuple[int, str]]
    coordinator_port: int
    policy: str
    client: list[str]  # after `python client.py`: host, port, data_dir, rounds, ...

    def client_line(self) -> str:
        return shlex.join(["python", "client.py", *self.client])


def readme_commands(text: str) -> Commands:
    """The three commands of the README's quick start, as they are written there."""
    section = text[text.index(SECTION):]
    block = re.search(r"^```\n(.*?)^```", section, re.S | re.M).group(1)
    nodes: list[tuple[int, str]] = []
    coordinator: list[str] = []
    client: list[str] = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words[:2] == ["python", "compute_node.py"]:
            if len(words) != 4:
                raise ValueError(f"a node line with options the sample cannot map: {line}")
            nodes.append((int(words[2]), words[3]))
        elif words[:2] == ["python", "coordinator_node.py"]:
            coordinator = words[2:]
        elif words[:2] == ["python", "client.py"]:
            client = words[2:]
    if not nodes or len(coordinator) != 2 or len(client) < 2:
        raise ValueError(f"{SECTION} of README.md lacks the three commands")
    return Commands(nodes, int(coordinator[0]), coordinator[1], client)


def nodes_file_entries(path: Path = NODES_FILE) -> list[tuple[str, int]]:
    """The (host, port) lines of the repository's compute_nodes.txt."""
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            host, port = line.split(",")
            entries.append((host.strip(), int(port)))
    return entries


def run(commands: Commands, workdir: Path, timeout: float = 300.0
        ) -> tuple[subprocess.CompletedProcess, list[int]]:
    """Run the commands as processes on 127.0.0.1; the client's result and the nodes' ports."""
    procs: list[local_cluster.Proc] = []
    try:
        for i, (_port, load) in enumerate(commands.nodes):
            procs.append(local_cluster.start_node(workdir, f"node{i + 1}", float(load)))
        nodes_file = local_cluster.write_nodes_file(workdir / "compute_nodes.txt", procs)
        coordinator = local_cluster.start_coordinator(workdir, nodes_file,
                                                      int(commands.policy))
        procs.append(coordinator)
        done = local_cluster.run_client(
            ["127.0.0.1", str(coordinator.port), *commands.client[2:]], workdir,
            timeout=timeout)
        return done, [p.port for p in procs[:-1]]
    finally:
        for proc in reversed(procs):
            proc.stop()


def render(stdout: str, workdir: Path, ports: list[int],
           shown: list[tuple[str, int]]) -> str:
    """The output as the README's commands would print it: the nodes under their names
    in compute_nodes.txt (padded to keep the table's columns) and the run folder under
    the repository."""
    text = stdout
    for port, (host, shown_port) in zip(ports, shown, strict=True):
        real = f"127.0.0.1:{port}"
        text = text.replace(real, f"{host}:{shown_port}".ljust(len(real)))
    text = text.replace(str(workdir.resolve() / "runs"), f"{SHOWN_REPO}/runs")
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"


def readme_text(commands: Commands, output: str) -> str:
    """What goes between the markers: the client's command, then its output."""
    return f"```\n$ {commands.client_line()}\n{output}```\n"


def readme_block(text: str) -> str:
    match = BLOCK.search(text)
    return match.group(2) if match else ""


def sample_output(block: str) -> str:
    """The output lines of a sample block (without its fences and its command line)."""
    lines = block.strip("\n").splitlines()
    return "\n".join(line for line in lines[1:] if not line.startswith(("```", "$ "))) + "\n"


SIZE = re.compile(r"\b\d+(\.\d+)? (B|kB|MB|GB)\b")
RUN_ID = re.compile(r"\b[0-9a-f]{12}\b")
TIMED_COUNTS = re.compile(r"\b(stale|cancelled) \d+")
UNUSED_ATTEMPTS = "Attempts not used:"  # client/display.py's unused_line


def shape(output: str) -> list[str]:
    """The output with what timing decides (wall time, run id, bytes, stale and cancelled
    attempts, the table's counts, node addresses, column widths) blanked out: the line
    labels, the fields and the deterministic numbers (the error, rounds, units) stay. The
    line that explains stale and cancelled attempts shows only when timing made some: it is
    left out."""
    lines = []
    for line in output.strip("\n").splitlines():
        line = line.strip()
        if line.startswith(UNUSED_ATTEMPTS):
            continue
        if line.startswith("│"):  # a node's row: its name and counts vary, its state not
            cells = [c.strip() for c in line.strip("│").split("│")]
            line = "│ " + " │ ".join(["<node>", cells[1], *("_" for _ in cells[2:])]) + " │"
        elif line.startswith("┃"):  # the header: its column names
            line = "┃ " + " ┃ ".join(c.strip() for c in line.strip("┃").split("┃")) + " ┃"
        elif line.startswith(("┏", "┡", "└")):  # the rules: their widths follow the cells
            line = re.sub(r"([━─])\1+", r"\1", line)
        line = re.sub(r"Wall time: [\d.]+ s", "Wall time: _ s", line)
        line = RUN_ID.sub("<run>", line)
        line = SIZE.sub("<size>", line)
        line = TIMED_COUNTS.sub(r"\1 _", line)
        line = re.sub(r"^(Run folder \(on the coordinator\): )\S*/runs/", r"\1.../runs/", line)
        lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the README's sample has another shape")
    args = parser.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    commands = readme_commands(text)
    with tempfile.TemporaryDirectory(prefix="readme-sample-") as tmp:
        workdir = Path(tmp)
        done, ports = run(commands, workdir)
        if done.returncode != 0:
            print(f"the client exited {done.returncode}:\n{done.stderr}", file=sys.stderr)
            return 1
        output = render(done.stdout, workdir, ports, nodes_file_entries())
    if args.check:
        same = shape(output) == shape(sample_output(readme_block(text)))
        print("README.md's sample output has the shape of the run's" if same else
              "README.md's sample output differs: run python scripts/gen_readme_sample.py")
        return 0 if same else 1
    if not BLOCK.search(text):
        raise SystemExit(f"{README} has no sample-output:begin/end markers")
    README.write_text(BLOCK.sub(lambda m: m.group(1) + readme_text(commands, output)
                                + m.group(3), text), encoding="utf-8")
    print(output, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
