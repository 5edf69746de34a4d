"""docs/reference/seed-parity.md names, for every behaviour of the seed pages, the Rust test and
the Python test that cover it. Each name must be a test that exists: a renamed or deleted test
fails here, at its row. A cell without a test says why (`n/a: ...`) or what is missing
(`gap: ...`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "reference" / "seed-parity.md"
REFERENCE = re.compile(r"`([\w./-]+)::(\w+)`")


@dataclass(frozen=True)
class Row:
    line: int
    number: str
    behaviour: str
    rust: str
    python: str


def rows() -> list[Row]:
    found = []
    for index, line in enumerate(PAGE.read_text().splitlines(), start=1):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].isdigit():
            found.append(Row(index, cells[0], cells[1], cells[3], cells[4]))
    return found


ROWS = rows()


def _defines(path: Path, name: str) -> bool:
    text = path.read_text()
    if path.suffix == ".rs":
        return re.search(rf"\bfn {name}\s*[(<]", text) is not None
    return re.search(rf"^\s*(async )?def {name}\(", text, re.MULTILINE) is not None


def test_the_table_numbers_its_rows_in_order() -> None:
    assert len(ROWS) >= 50, f"{PAGE} has {len(ROWS)} rows"
    assert [row.number for row in ROWS] == [str(n) for n in range(1, len(ROWS) + 1)]


@pytest.mark.parametrize("row", ROWS, ids=lambda row: f"row {row.number}")
def test_each_row_names_tests_that_exist_or_says_why_not(row: Row) -> None:
    for column, cell, suffix in (("Rust", row.rust, ".rs"), ("Python", row.python, ".py")):
        references = REFERENCE.findall(cell)
        where = f"{PAGE.name}:{row.line} ({row.behaviour}), {column}"
        if not references:
            assert cell.startswith(("n/a:", "gap:")), f"{where}: no test, and no reason: {cell!r}"
            continue
        for file, name in references:
            path = REPO / file
            assert path.suffix == suffix, f"{where}: {file} is not a {column} file"
            assert path.is_file(), f"{where}: no file {file}"
            assert _defines(path, name), f"{where}: {file} defines no test {name}"
