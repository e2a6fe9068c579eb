"""The figures BENCHMARKS.md's prose types in by hand, and whether each comes from a result file.

    python -m bench.prose [--page BENCHMARKS.md] [--results bench/results]

The page is read section by section (``## `` headings). A number in a section's prose (outside the
generated blocks, code spans and code blocks) is *sourced* when it is a small count (0 to 10), one
of the floors' own thresholds, a number printed in the section's generated tables, or a value of a
result file the section draws on — the files its generated blocks are built from and every
``*.json`` file it names — at the precision the prose writes it, in the units the page uses
(seconds or milliseconds, fractions or per cent, bytes, kB, MB, MiB or GiB). Everything else is
reported: a figure from a run that is not committed, or one that no longer matches its file.
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

NUMBER = re.compile(r"(?<![\w.\-/^])\d(?:[\d,]*\d)?(?:\.\d+)?(?![\w.]*\w)")
BLOCK = re.compile(r"<!-- bench:(\w+) -->\n.*?<!-- /bench:\1 -->", re.S)
FENCE = re.compile(r"```.*?```", re.S)
CODE = re.compile(r"`[^`\n]*`")
CITED = re.compile(r"[\w.\-/{},]*?([\w\-]+\.json)")
SCALES = (1.0, 1e3, 1e2, 1e-3, 1e-6, 2.0**-20, 2.0**-30)
SKIP_KEYS = {"timeline"}
BLOCK_FILES = {"comm": "comm.json", "aggregation": "aggregation.json", "worker": "worker.json"}
BLOCK_FILES |= {"ingest": "ingest.json", "e2e": "e2e.json"}
THRESHOLDS = {
    floors.COMM_FLOOR,
    floors.FEDAVG_FLOOR,
    floors.UPLOAD_FLOOR,
    floors.DELIVERY_FLOOR,
    floors.WORKER_FLOOR,
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


def matches(token: str, values: Iterable[float]) -> bool:
    """Whether a printed number is one of the values, rounded as printed, in one of the page's units."""
    x = _value(token)
    decimals = len(token.split(".", 1)[1]) if "." in token else 0
    tolerance = 0.5 * 10.0**-decimals + 1e-9
    return any(abs(v * s - x) <= tolerance for v in values for s in SCALES)


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
        for token in NUMBER.findall(prose):
            x = _value(token)
            if token in printed or (x.is_integer() and 0 <= x <= 10) or matches(token, values):
                continue
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
