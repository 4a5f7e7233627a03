"""The fenced code blocks of the documentation (``docs/`` and ``README.md``), read as printed.

A block that a test runs is named in the page's source by a comment on the line before it,
``<!-- block: NAME -->``, and a test reads it with :func:`docs_block` ``("NAME")``. A block
whose lines are only ``--8<-- "path"`` is included from that file when the site is built.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

# A fence, indented or not (in a list item), of backticks or tildes.
_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)(?:\s.*)?$")
_NAME = re.compile(r"^<!-- block: ([\w-]+) -->$")
_INCLUDE = re.compile(r'^--8<-- "([^"]+)"$')


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its name and its text."""

    page: Path
    line: int
    language: str
    name: str | None
    text: str

    @property
    def includes(self) -> list[str]:
        """The files the block is included from, if it is only ``--8<--`` lines."""
        lines = [line for line in self.text.splitlines() if line.strip()]
        found = [m.group(1) for line in lines if (m := _INCLUDE.match(line.strip()))]
        return found if found and len(found) == len(lines) else []


def pages() -> list[Path]:
    """Every Markdown page of the documentation, the README first."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of ``page``, in order."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        fence, language = opening.groups()
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == fence)
        previous = lines[index - 1] if index else ""
        named = _NAME.match(previous.strip())
        found.append(
            Block(
                page=page,
                line=index + 1,
                language=language,
                name=named.group(1) if named else None,
                text="\n".join(lines[index + 1 : end]) + "\n",
            )
        )
        index = end + 1
    return found


def all_blocks() -> list[Block]:
    """Every fenced code block of every page."""
    return [block for page in pages() for block in blocks(page)]


def docs_block(name: str) -> str:
    """The text of the block named ``name``, exactly as printed (one block per name)."""
    (block,) = [block for block in all_blocks() if block.name == name]
    return block.text
