"""Every table in the user docs renders: each run of ``|`` lines outside code blocks starts
with a header and a delimiter row, and every row has the header's number of cells. A row
cut off from its table (by a blank line or a paragraph) would render as stray text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = sorted((Path(__file__).resolve().parent.parent / "docs").glob("*.md"))
DELIMITER = re.compile(r"^\|?(\s*:?-{3,}:?\s*\|)*\s*:?-{3,}:?\s*\|?$")


def cell_count(row: str) -> int:
    """The cells of a table row: pipes split them unless escaped (``\\|``)."""
    row = row.strip()
    parts = re.split(r"(?<!\\)\|", row)
    return len(parts) - row.startswith("|") - (row.endswith("|") and not row.endswith("\\|"))


def table_problems(text: str) -> list[str]:
    """Where ``text`` has a table that would not render as one."""
    problems: list[str] = []
    lines = text.splitlines()
    in_code = False
    index = 0
    while index < len(lines):
        line = lines[index].strip()
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("|"):
            index += 1
            continue
        start = index
        block = []
        while index < len(lines) and lines[index].strip().startswith("|"):
            block.append(lines[index].strip())
            index += 1
        if len(block) < 2 or not DELIMITER.match(block[1]):
            problems.append(f"line {start + 1}: table rows without a header and delimiter row")
            continue
        width = cell_count(block[0])
        for offset, row in enumerate(block[1:], start=1):
            if cell_count(row) != width:
                problems.append(f"line {start + offset + 1}: {cell_count(row)} cells, not {width}")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=[doc.name for doc in DOCS])
def test_every_table_renders(doc: Path) -> None:
    assert table_problems(doc.read_text(encoding="utf-8")) == []


def test_the_checker_sees_a_cut_table_and_a_short_row() -> None:
    cut = "| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n"
    assert table_problems(cut) == ["line 5: table rows without a header and delimiter row"]
    short = "| a | b |\n|---|---|\n| 1 |\n| `x\\|y` | 2 |\n"
    assert table_problems(short) == ["line 3: 1 cells, not 2"]
    assert len(DOCS) > 10
