"""Every relative link of README.md and docs/*.md reaches an existing file and, with an
#anchor, a heading of that page (as GitHub names headings' anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devtools.local_cluster import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DEFINITION = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto:, ...


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    found: set[str] = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for heading in HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    return LINK.findall(text) + DEFINITION.findall(text)


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with that anchor")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_reaches_a_file_and_heading(page: Path) -> None:
    assert broken_links(page) == []


def test_the_checker_sees_missing_files_and_headings(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Deployment and security: one page\n\n## 1. A token\n"
                                       "## Relays (`--relay`, `x.y_z`)\n## Relays\n## Relays\n"
                                       "```\n## Not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#deployment-and-security-one-page) [b](other.md#1-a-token) "
                    "[c](other.md#relays---relay-xy_z) [d](other.md#relays-1) "
                    "[e](missing.md) [f](other.md#nowhere) [g](#here) [h](other.md) "
                    "![i](img.png) [j](https://example.org/x) `[k](in-code.md)`\n"
                    "[l](other.md#not-a-heading)\n"
                    "```\n[m](inside-a-fence.md)\n```\n## Here\n")
    assert broken_links(page) == ["missing.md: no such file",
                                  "other.md#nowhere: no heading with that anchor",
                                  "img.png: no such file",
                                  "other.md#not-a-heading: no heading with that anchor"]
