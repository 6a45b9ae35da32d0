"""Every pointer to a section of a docs page lands on a heading: the code's and the pages'
`docs/<PAGE>.md, "<Section>"` references, and the pages' markdown `#anchor` links."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
SOURCE_FOLDERS = ("gateway", "worker", "shared", "ops", "tests")
# `docs/BENCHMARKS.md, "Hardening"`, also wrapped over a comment's lines (`# serving defaults"`)
SECTION_REFERENCE = re.compile(r'docs/([A-Z]+\.md)`?,\s*(?:#\s*)?"([^"]+)"')
# [text](#anchor), [text](docs/PAGE.md#anchor), [text](PAGE.md#anchor)
ANCHOR_LINK = re.compile(r"\]\((?:(?:docs/)?([A-Z]+\.md))?#([^)\s]+)\)")


def headings(page: Path) -> list[str]:
    lines = page.read_text().splitlines()
    in_code = False
    found = []
    for line in lines:
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.append(line.lstrip("#").strip())
    return found


def github_anchor(heading: str) -> str:
    """GitHub's slug: lower case, punctuation dropped (backticks, dots, colons), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def referring_files() -> list[Path]:
    sources = [path for folder in SOURCE_FOLDERS for path in (ROOT / folder).rglob("*.py")]
    return [*PAGES, ROOT / "Makefile", *sources]


def test_github_anchor_matches_githubs_rule() -> None:
    assert github_anchor("Redis failover: `arbor bench failover`") == "redis-failover-arbor-bench-failover"
    assert github_anchor("Against llama.cpp, per CPU kind") == "against-llamacpp-per-cpu-kind"


def test_every_named_section_is_a_heading_of_its_page() -> None:
    missing = []
    for path in referring_files():
        for match in SECTION_REFERENCE.finditer(path.read_text()):
            page, section = (
                DOCS / match.group(1),
                " ".join(re.sub(r"\n\s*#?", " ", match.group(2)).split()).replace("`", ""),
            )
            titles = [title.replace("`", "").lower() for title in headings(page)] if page.exists() else []
            if not any(section.lower() in title for title in titles):
                missing.append(f"{path.relative_to(ROOT)}: {match.group(1)}, {section!r}")
    assert not missing, f"sections no heading names: {missing}"


def test_every_anchor_link_lands_on_a_heading() -> None:
    broken = []
    for path in PAGES:
        for match in ANCHOR_LINK.finditer(path.read_text()):
            page = DOCS / match.group(1) if match.group(1) else path
            anchors = {github_anchor(title) for title in headings(page)} if page.exists() else set()
            if match.group(2) not in anchors:
                broken.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert not broken, f"links to no heading: {broken}"
