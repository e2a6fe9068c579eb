"""The figures BENCHMARKS.md's prose types in by hand, and whether each comes from a result file.

    python -m bench.prose [--page BENCHMARKS.md] [--results bench/results]

The page is read section by section (``## `` headings). A number in a section's prose (outside the
generated blocks, code spans and code blocks) is *sourced* when it is a small count (0 to 10), an
issue's number, one of the floors' own thresholds, a number printed in the section's generated
tables, or a value of a result file the section draws on — the files its generated blocks are
built from and every ``*.json`` file it names — at the precision the prose writes it, in the unit
written after it (seconds as s or ms, fractions as %, bytes as kB, MB, MiB or GiB; a number without
one of these units as it is). Everything else is reported: a figure from a run that is not
committed, or one that no longer matches its file. A section that cites many files offers many
values, so a typed figure can still hit one by chance; the check catches most, not all.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench import floors
from bench.common import RESULTS, ROOT
from bench.report import TABLES

NUMBER = re.compile(r"(?<![\w.\-/^])\d(?:[\d,]*\d)?(?:\.\d+)?(?![\w.]*\w)")
BLOCK = re.compile(r"<!-- bench:(\w+) -->\n.*?<!-- /bench:\1 -->", re.S)
FENCE = re.compile(r"```.*?```", re.S)
CODE = re.compile(r"`[^`\n]*`")
CITED = re.compile(r"[\w.\-/{},]*?([\w\-]+\.json)")
UNIT = re.compile(r"(?:\s?–\s?[\d.,]+)?\s?(ms|s|%|MiB|GiB|kB|MB)(?![\w/])")
REFERENCE = re.compile(r"(?:issue|issues|§)\s?$", re.I)
SCALES = {"ms": (1e3,), "s": (1.0,), "%": (1e2, 1.0), "MiB": (1.0, 2.0**-20), "GiB": (1.0, 2.0**-30)}
SCALES |= {"kB": (1e-3,), "MB": (1e-6,)}
SKIP_KEYS = {"timeline"}
# the generated blocks and the result file each is built from: the report's own table
BLOCK_FILES = {name: file for name, (file, _) in TABLES.items()}
THRESHOLDS = {
    floors.COMM_FLOOR,
    floors.FEDAVG_FLOOR,
    floors.CPU_PER_REQUEST_MS,
    floors.DELIVERY_P99_S,
    floors.ROUNDS_PER_MIN,
    floors.WORKER_FLOOR,
    floors.PEERS_GOAL,
    floors.SCALE_FLOOR,
    float(floors.FEDAVG_K),
    float(floors.INGEST_K),
    float(floors.MIN_REPEATS),
}


def _value(token: str) -> float:
    return float(token.replace(",", ""))


def values_of(doc: Any) -> Iterable[float]:
    """Every number in a result file, strings (commands) included, time series left out."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key not in SKIP_KEYS:
                yield from values_of(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from values_of(value)
    elif isinstance(doc, bool) or doc is None:
        return
    elif isinstance(doc, int | float):
        yield float(doc)
    else:
        yield from (_value(n) for n in NUMBER.findall(str(doc)))


def matches(token: str, values: Iterable[float], unit: str | None = None) -> bool:
    """Whether a printed number is one of the values, rounded as printed, in the unit written after it
    (seconds as s or ms, fractions as %, bytes as kB, MB, MiB or GiB; anything else as it is)."""
    x = _value(token)
    decimals = len(token.split(".", 1)[1]) if "." in token else 0
    tolerance = 0.5 * 10.0**-decimals + 1e-9
    scales = SCALES.get(unit or "", (1.0,))
    return any(abs(v * s - x) <= tolerance for v in values for s in scales)


def _file(results: Path, name: str) -> Path | None:
    direct = results / name
    if direct.exists():
        return direct
    return next(iter(sorted(results.rglob(name))), None)


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each ``## `` section, the part before the first heading included."""
    parts = re.split(r"^(## .*)$", text, flags=re.M)
    out = [("(top)", parts[0])]
    out += [(parts[i].strip(), parts[i + 1]) for i in range(1, len(parts) - 1, 2)]
    return out


def unsourced(text: str, results: Path) -> list[str]:
    """'heading: number' for every figure in the prose that none of its sources holds."""
    out = []
    for heading, body in sections(text):
        blocks = [m.group(0) for m in BLOCK.finditer(body)]
        names = {BLOCK_FILES[m.group(1)] for m in BLOCK.finditer(body) if m.group(1) in BLOCK_FILES}
        if any(m.group(1) == floors.MARKER for m in BLOCK.finditer(body)):
            names |= {name for name, _ in floors.SOURCES}
        prose = FENCE.sub(" ", BLOCK.sub(" ", body))
        names |= {m.group(1) for m in CITED.finditer(body)}
        prose = CODE.sub(" ", prose)
        values = set(THRESHOLDS)
        for name in names:
            path = _file(results, name)
            if path is not None:
                values |= set(values_of(json.loads(path.read_text())))
        printed = {t for block in blocks for t in NUMBER.findall(block)}
        for m in NUMBER.finditer(prose):
            token, x = m.group(0), _value(m.group(0))
            if token in printed or (x.is_integer() and 0 <= x <= 10):
                continue
            if REFERENCE.search(prose[max(0, m.start() - 8) : m.start()]):
                continue
            unit = UNIT.match(prose, m.end())
            if not matches(token, values, unit.group(1) if unit else None):
                out.append(f"{heading}: {token}")
    return out


def main(argv: list[str] | None = None) -> None:
    """Print every unsourced figure of the page."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--page", default=str(ROOT / "BENCHMARKS.md"))
    ap.add_argument("--results", default=str(RESULTS))
    args = ap.parse_args(argv)
    found = unsourced(Path(args.page).read_text(), Path(args.results))
    print("\n".join(found) if found else "every figure in the prose comes from a result file")
    raise SystemExit(1 if found else 0)


if __name__ == "__main__":
    main()
