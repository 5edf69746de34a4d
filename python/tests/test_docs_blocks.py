"""Every ```python block of the user documentation (README.md, CONTRIBUTING.md, ARCHITECTURE.md, the
package's python/README.md and the book under docs/) compiles, and runs: its imports, definitions and decorators execute, so a name
the SDK no longer has or an option a decorator refuses fails here, at the page's own line. A block
that cannot run alone (lines of a larger program) says why in an HTML comment `<!-- not run: ... -->`
right above it; it is still compiled, and its imports still run.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOT_RUN = re.compile(r"<!-- not run: .+ -->")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    """The line of the opening fence."""
    source: str
    not_run: bool


def pages() -> list[Path]:
    top = [
        REPO / "README.md",
        REPO / "CONTRIBUTING.md",
        REPO / "ARCHITECTURE.md",
        REPO / "python" / "README.md",
    ]
    return top + sorted((REPO / "docs").rglob("*.md"))


def python_blocks() -> list[Block]:
    blocks = []
    for path in pages():
        lines = path.read_text().splitlines()
        index = 0
        while index < len(lines):
            fence = lines[index].strip()
            if not fence.startswith("```"):
                index += 1
                continue
            end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
            if fence == "```python":
                above = lines[index - 1].strip() if index else ""
                blocks.append(
                    Block(
                        page=str(path.relative_to(REPO)),
                        line=index + 1,
                        source="\n".join(lines[index + 1 : end]) + "\n",
                        not_run=NOT_RUN.fullmatch(above) is not None,
                    )
                )
            index = end + 1
    return blocks


BLOCKS = python_blocks()


def parsed(block: Block) -> ast.Module:
    """The block's syntax tree, numbered as the page's lines so errors point into the page."""
    tree = ast.parse(block.source, filename=block.page)
    return ast.increment_lineno(tree, block.line)


def test_the_docs_have_python_blocks() -> None:
    assert len(BLOCKS) >= 3, BLOCKS


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: f"{block.page}:{block.line}")
def test_a_docs_python_block_runs(block: Block) -> None:
    tree = parsed(block)
    if block.not_run:
        compile(tree, block.page, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        imports: list[ast.stmt] = [
            node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)
        ]
        tree = ast.Module(body=imports, type_ignores=[])
    namespace: dict[str, object] = {"__name__": "docs_block"}
    exec(compile(tree, block.page, "exec"), namespace)  # noqa: S102 (the docs' own code)
