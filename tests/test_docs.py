"""The front of the house holds: the README's test command is what CI runs, every link in the
README and docs/ leads to a file of this repository, nothing cites a path outside it, and every
figure of the README's results table links the committed results it comes from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted([README, *(REPO / "docs").glob("*.md"), REPO / "benchmarks" / "README.md",
               REPO / "benchmarks" / "gpu_kit" / "README.md", REPO / "sidecar_tools" / "benchmarks" / "README.md",
               *(REPO / "benchmarks" / "results").rglob("README.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _id(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_readme_test_command_is_what_ci_runs():
    readme = README.read_text()
    command = readme.split("# 2. The tests", 1)[1].splitlines()[1]
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == command


def test_readme_is_read_in_five_minutes():
    assert len(README.read_text().splitlines()) <= 250


@pytest.mark.parametrize("doc", DOCS, ids=_id)
def test_links_lead_to_files_of_the_repository(doc: Path):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.exists() or not path.is_relative_to(REPO):
            broken.append(target)
    assert broken == [], f"{_id(doc)}: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=_id)
def test_nothing_cited_outside_the_repository(doc: Path):
    text = doc.read_text()
    assert "../shared" not in text and "/work/" not in text


def test_every_results_row_links_its_committed_results():
    section = README.read_text().split("## Results", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| workload")]
    assert len(rows) >= 4
    for row in rows:
        links = [t for t in LINK.findall(row) if t.startswith("benchmarks/results/")]
        assert links and all((REPO / t).exists() for t in links), row
