"""The docs stand alone: every relative link in a Markdown file points to a file of this
repository, and every link to a heading names one that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_links_stay_in_the_repository_and_resolve(doc: Path) -> None:
    bad = []
    for target in LINK.findall(doc.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if ROOT not in dest.parents and dest != ROOT:
            bad.append(f"{target}: outside the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no such heading")
    assert not bad, f"{doc.name}: {bad}"


def test_the_checker_sees_links() -> None:
    assert len(DOCS) >= 10
    assert sum(len(LINK.findall(d.read_text())) for d in DOCS) >= 50
