"""The options the README and the docs pages name exist: each `--flag` is defined by one
of the commands (or by the bench or scripts file that takes it, scripts/test.sh included),
and the certificate commands of docs/deployment.md are the ones the TLS tests run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devtools.local_cluster import REPO
from tests import tls_certs

PAGES = [REPO / "README.md", *(REPO / "docs" / name for name in (
    "usage.md", "algorithms.md", "deployment.md", "faults.md", "dashboard.md",
    "how-it-works.md", "plugins.md", "extending.md"))]
SOURCES = ["compute_node", "coordinator", "client", "wire", "dashboard", "engine", "bench",
           "scripts", "devtools", "training"]
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
DEFINED = re.compile(r"[\"'](--[a-z][a-z0-9-]*)[\"']")


def defined_flags() -> set[str]:
    flags: set[str] = {"--help"}  # argparse's own
    sources = [path for folder in SOURCES for path in (REPO / folder).rglob("*.py")]
    for source in [*sources, *(REPO / "scripts").glob("*.sh")]:
        flags.update(DEFINED.findall(source.read_text(encoding="utf-8")))
    return flags


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_flag_a_page_names_is_defined(page: Path) -> None:
    named = set(FLAG.findall(page.read_text(encoding="utf-8")))
    assert named, page
    assert sorted(named - defined_flags()) == []


def test_the_three_commands_flags_on_the_deployment_page_are_theirs() -> None:
    page = (REPO / "docs" / "deployment.md").read_text(encoding="utf-8")
    for flag in ("--token-file", "--tls-cert", "--tls-key", "--tls-ca", "--max-frame-mb",
                 "--idle-timeout", "--frame-timeout", "--max-connections",
                 "--max-connections-per-peer", "--max-pending-frames-mb", "--pull",
                 "--register", "--advertise", "--retry-for", "--relay", "--members-port",
                 "--relay-policy", "--workers", "--device", "--host"):
        assert flag in page, flag


def test_the_certificate_commands_are_those_the_tls_tests_run() -> None:
    page = (REPO / "docs" / "deployment.md").read_text(encoding="utf-8")
    printed = re.search(r"printf '%s\\n' (.*?) > node1\.ext", page, re.S).group(1)
    extensions = re.findall(r'"([^"]+)"', printed)
    assert extensions[0].startswith("subjectAltName=")
    assert extensions[1:] == tls_certs.SERVER_EXTENSIONS.splitlines()[1:]
    made_by_tests = Path(tls_certs.__file__).read_text(encoding="utf-8")
    for addext in re.findall(r'-addext "([^"]+)"', page):
        assert f'"{addext}"' in made_by_tests
    for words in ("-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes", "-CAcreateserial"):
        assert words in page
        assert all(f'"{w}"' in made_by_tests for w in words.split())
