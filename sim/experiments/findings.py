"""The findings at a glance: every computed verdict of RESULTS.md's readings, one row per claim, the
data sets grouped by verdict. The README shows this table between its findings markers; `fedprompt
experiment report` writes it there, and a test fails when the README's copy differs.

A claim is a column of a table in a config's reading whose cells are `{{verdict: …}}` placeholders
(the column's header states it); each row's first cell names what the verdict is about (the data
set), with the row's other leading cells that hold no placeholder (a table's key, e.g. α) beside it
in brackets, so that rows of one data set stay apart. The verdict words are read from the rendered cells, so the README says exactly what RESULTS.md
says. Pure: text in, text out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from fedprompt.sim.experiments.verdicts import FAILS, HOLDS, INCONCLUSIVE, NOT_LEARNED

VERDICTS = (HOLDS, FAILS, INCONCLUSIVE, NOT_LEARNED)
BEGIN, END = "<!-- findings -->", "<!-- /findings -->"
_DIVIDER = re.compile(r"^\|\s*:?-{3,}")


@dataclass(frozen=True)
class Finding:
    """One claim of one experiment and, per verdict, the rows (data sets) that got it."""

    section: str
    anchor: str
    claim: str
    rows: dict[str, list[str]] = field(default_factory=dict)


def _tables(text: str) -> list[list[list[str]]]:
    """The markdown tables of a text: each a list of rows (header first, the divider left out), each
    row a list of its cells, stripped."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in text.splitlines() + [""]:
        stripped = line.strip()
        if stripped.startswith("|") and stripped.endswith("|"):
            if not _DIVIDER.match(stripped):
                current.append([cell.strip() for cell in stripped[1:-1].split("|")])
            continue
        if current:
            tables.append(current)
            current = []
    return tables


def verdict_word(cell: str) -> str | None:
    """The verdict a rendered cell states ('holds (+0.3 points, …)' → 'holds'), None for another cell."""
    return next((word for word in VERDICTS if cell == word or cell.startswith(word + " (")), None)


def anchor_of(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    kept = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return kept.replace(" ", "-")


def _key_columns(raw_table: list[list[str]]) -> int:
    """How many leading columns of a reading's table hold no placeholder in any row: its key."""
    count = 0
    for col in range(len(raw_table[0])):
        if any("{{" in row[col] for row in raw_table[1:] if col < len(row)):
            break
        count += 1
    return max(count, 1)


def _row_name(header: list[str], row: list[str], keys: int) -> str:
    """A row's name: its first cell, with its other key cells as 'header value' in brackets."""
    extra = [f"{header[i]} {row[i]}" for i in range(1, min(keys, len(row)))]
    return f"{row[0]} ({', '.join(extra)})" if extra else row[0]


def findings_of(title: str, raw: str, rendered: str) -> list[Finding]:
    """The claims of one reading: `raw` as the config writes it, `rendered` with its placeholders
    filled (the same tables, row for row)."""
    out = []
    for raw_table, table in zip(_tables(raw), _tables(rendered), strict=False):
        header = table[0]
        keys = _key_columns(raw_table)
        for col, claim in enumerate(header):
            if col == 0 or not any("{{verdict:" in row[col] for row in raw_table[1:] if col < len(row)):
                continue
            rows: dict[str, list[str]] = {}
            for row in table[1:]:
                word = verdict_word(row[col]) if col < len(row) else None
                if word is not None:
                    rows.setdefault(word, []).append(_row_name(header, row, keys))
            out.append(Finding(title, anchor_of(title), claim, rows))
    return out


def findings_table(findings: Sequence[Finding], results: str = "RESULTS.md") -> str:
    """The README's table: a row per claim, its section linked, the rows named under each verdict."""
    lines = [
        "| finding ([rules](docs/simulation.md#experiment-grids)) | " + " | ".join(VERDICTS) + " |",
        "|---" * (1 + len(VERDICTS)) + "|",
    ]
    for f in findings:
        where = f"[{f.section}]({results}#{f.anchor})"
        cells = [", ".join(f.rows.get(word, [])) or "–" for word in VERDICTS]
        lines.append(f"| {where}: {f.claim} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def replace_findings(readme: str, table: str) -> str:
    """The README with the text between its findings markers replaced by `table`; ValueError when
    the markers are missing."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the README has no {BEGIN} … {END} block for the findings table")
    return readme[: start + len(BEGIN)] + "\n" + table + "\n" + readme[end:]


def findings_in(readme: str) -> str:
    """The text between the README's findings markers (stripped), '' when there are none."""
    start, end = readme.find(BEGIN), readme.find(END)
    return readme[start + len(BEGIN) : end].strip() if 0 <= start < end else ""
