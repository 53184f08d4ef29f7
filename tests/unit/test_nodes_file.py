"""compute_nodes.txt parsing: comments, blanks, and errors that name the line."""

from __future__ import annotations

import logging
import os
import socket
import time

import pytest

from thrift_trainer.engine.nodes import nodes_file
from thrift_trainer.engine.nodes.nodes_file import (
    NodeAddress,
    NodesFile,
    NodesFileError,
    parse_nodes,
    read_nodes_file,
)


def test_comments_and_blank_lines_are_ignored():
    text = "# lab machines\n\nlocalhost,9091\n  host-b , 9092  # second\n"
    assert parse_nodes(text) == [NodeAddress("localhost", 9091), NodeAddress("host-b", 9092)]


@pytest.mark.parametrize("text, message", [
    ("localhost,9091\nlocalhost:9092\n", "line 2: expected 'host,port'"),
    ("localhost,abc\n", "line 1: port 'abc' is not a number"),
    ("localhost,70000\n", "line 1: port 70000 is outside"),
    (",9091\n", "line 1: expected 'host,port'"),
    ("a,1\nb,2\na,1\n", "line 3: a:1 is listed twice"),
    ("\n# nothing\n", "lists no compute node"),
])
def test_malformed_files_name_the_line(text, message):
    with pytest.raises(NodesFileError, match=message):
        parse_nodes(text, source="nodes.txt")


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(NodesFileError, match="nodes.txt not found"):
        read_nodes_file(tmp_path / "nodes.txt")


def test_parsing_is_linear_in_the_number_of_lines():
    """20,000 lines: a quadratic duplicate check took ~20 s here, a linear one milliseconds."""
    text = "".join(f"host-{i},{1024 + i % 60000}\n" for i in range(20_000))
    started = time.perf_counter()
    nodes = parse_nodes(text)
    assert len(nodes) == 20_000
    assert time.perf_counter() - started < 2.0  # 100x the linear time, even under load


def _counting_reads(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = nodes_file.read_nodes_file

    def counted(path):
        calls.append(1)
        return real(path)

    monkeypatch.setattr(nodes_file, "read_nodes_file", counted)
    return calls


def _rewrite(path, text: str) -> None:
    """Write and move the mtime on, so that even a coarse clock sees a change."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    os.utime(path, ns=(before + 10**9, before + 10**9))


def test_the_file_is_parsed_again_only_after_it_changed(tmp_path, monkeypatch):
    calls = _counting_reads(monkeypatch)
    path = tmp_path / "nodes.txt"
    _rewrite(path, "a,1\n")
    nodes = NodesFile(path)
    for _ in range(5):
        assert nodes.read() == [NodeAddress("a", 1)]
    assert len(calls) == 1
    _rewrite(path, "a,1\nb,2\n")
    assert nodes.read() == [NodeAddress("a", 1), NodeAddress("b", 2)]
    assert nodes.read() == [NodeAddress("a", 1), NodeAddress("b", 2)]
    assert len(calls) == 2


def test_an_unchanged_broken_file_keeps_its_error(tmp_path):
    path = tmp_path / "nodes.txt"
    _rewrite(path, "a,x\n")
    nodes = NodesFile(path)
    for _ in range(2):
        with pytest.raises(NodesFileError, match="line 1"):
            nodes.read()
    _rewrite(path, "a,1\n")
    assert nodes.read() == [NodeAddress("a", 1)]


@pytest.mark.parametrize("bound, line", [
    ("0.0.0.0", "localhost,9095"), ("0.0.0.0", "127.0.0.1,9095"),
    ("0.0.0.0", "LOCALHOST,9095"), ("0.0.0.0", "127.0.0.2,9095"),
    ("0.0.0.0", f"{socket.gethostname()},9095"), ("10.1.2.3", "10.1.2.3,9095"),
    ("::", "::1,9095"),
])
def test_the_coordinators_own_address_is_refused(tmp_path, bound, line):
    path = tmp_path / "nodes.txt"
    _rewrite(path, f"other,9091\n{line}\n")
    nodes = NodesFile(path)
    nodes.serve_at(bound, 9095)
    with pytest.raises(NodesFileError, match="this coordinator's own address"):
        nodes.read()


@pytest.mark.parametrize("line", ["localhost,9096", "remote-host,9095", "10.1.2.4,9095"])
def test_other_ports_and_hosts_are_not_the_coordinator(tmp_path, line):
    path = tmp_path / "nodes.txt"
    _rewrite(path, f"{line}\n")
    nodes = NodesFile(path)
    nodes.serve_at("0.0.0.0", 9095)
    assert [str(n) for n in nodes.read()] == [line.replace(",", ":")]


def test_aliases_of_one_node_are_used_once_with_one_warning_per_change(tmp_path, caplog):
    path = tmp_path / "nodes.txt"
    text = ("localhost,9091\n127.0.0.1,9091\nLOCALHOST,9091\nhost-b,9092\nHOST-B.,9092\n"
            "localhost,9093\n")
    _rewrite(path, text)
    nodes = NodesFile(path)
    caplog.set_level(logging.WARNING, logger="coordinator.nodes")
    for _ in range(3):
        assert nodes.read() == [NodeAddress("localhost", 9091), NodeAddress("host-b", 9092),
                                NodeAddress("localhost", 9093)]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "3 lines name a node listed before" in warnings[0]
    assert "127.0.0.1:9091 (same as localhost:9091)" in warnings[0]
    _rewrite(path, text + "# edited\n")
    nodes.read()
    assert len(caplog.records) == 2
