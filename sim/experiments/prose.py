"""Figures in words: the number formats of the tables, and the placeholders of a config's prose
(`{{final_accuracy @ dataset=sst2}}`, see sim/experiments/report.py) filled from the records."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from fedprompt.sim.experiments.config import Cell, ConfigError, ExperimentConfig, expand, matches
from fedprompt.sim.experiments.records import metrics_of
from fedprompt.sim.experiments.verdicts import NOT_LEARNED, learned, mean_sd, paired, t_interval, verdict

PERCENT = {
    "initial_accuracy",
    "final_accuracy",
    "initial_asr",
    "final_asr",
    "max_asr",
    "local_asr",
    "max_local_asr",
    "local_accuracy",
    "accuracy_drop",
    "accuracy_gain",
    "final_macro_f1",
    "majority_rate",
    "best_accuracy",
    "best_macro_f1",
    "collapsed",  # the share of the seeds whose final version collapsed
}


def _number(metric: str, value: float) -> str:
    if metric in PERCENT:
        return f"{100 * value:.1f}"
    if metric == "wall_seconds":
        return f"{value:.0f}"
    if metric == "params_sent":
        return f"{value:,.0f}"
    if metric == "rejected":  # a count; its mean and std over seeds to a tenth
        return f"{value:.1f}".removesuffix(".0")
    if metric == "noise":
        return f"{value:.3g}"
    if metric.startswith("epsilon"):
        return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def stat(metric: str, values: Sequence[float], *, with_n: bool = True) -> str:
    """A cell's figure: the value of one seed, else mean ± std (sample std) over the seeds, (n);
    a figure every seed gave alike (a setting such as ε, up to float rounding) without the ± 0."""
    if not values:
        return "–"
    if len(values) == 1:
        return _number(metric, values[0])
    mean, std = mean_sd(values)
    if all(math.isclose(v, values[0], rel_tol=1e-9, abs_tol=1e-12) for v in values):
        text = _number(metric, mean)
        return f"{text} ({len(values)})" if with_n else text
    text = f"{_number(metric, mean)} ± {_number(metric, std)}"
    return f"{text} ({len(values)})" if with_n else text


def _values(metric: str, records: list[dict[str, Any]]) -> list[float]:
    out = []
    for r in records:
        value = metrics_of(r).get(metric)
        if value is not None:
            out.append(value)
    return out


def _params(config: ExperimentConfig, cell: Cell) -> dict[str, Any]:
    return {**config.base, **cell.params}


PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)


def _pattern(text: str) -> dict[str, str]:
    """'dataset=sst2, aggregation=multi_krum:f=1,m=7' → {'dataset': 'sst2', 'aggregation': 'multi_krum:f=1,m=7'}."""
    out = {}
    for part in re.split(r",\s*(?=[A-Za-z_][A-Za-z0-9_]*=)", text.strip()):
        key, sep, value = part.strip().partition("=")
        if not sep:
            raise ConfigError(f"placeholder pattern '{text}': '{part}' is not key=value")
        out[key.strip()] = value.strip()
    return out


def _cell_records(config: ExperimentConfig, records: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """The finished records of the one cell a placeholder pattern names: every seed's, or with
    `seed=N` in the pattern that seed's alone."""
    pattern = _pattern(text)
    seed = pattern.pop("seed", None)
    chosen = [c for c in expand(config) if matches(_params(config, c), pattern)]
    distinct = {json.dumps(c.params, sort_keys=True, default=str) for c in chosen}
    if len(distinct) != 1:
        raise ConfigError(
            f"{config.name}: placeholder pattern '{text}' matches {len(distinct)} cells; it must name one"
        )
    ids = {c.id for c in chosen if seed is None or str(c.seed) == seed}
    return [r for r in records if r["cell"] in ids and r.get("done")]


def _series(metric: str, done: list[dict[str, Any]]) -> str:
    """Round 0 (the starting prompt's figure) to the last round, averaged over the seeds."""
    if not done:
        return "–"
    first = {"asr": "initial_asr", "accuracy": "initial_accuracy"}.get(metric)
    columns: list[list[float]] = []
    for r in done:
        points = [metrics_of(r).get(first)] if first else []
        points += [p.get(metric) for p in r.get("rounds") or []]
        columns.append([p for p in points if p is not None])
    length = min(len(c) for c in columns)
    means = [sum(c[i] for c in columns) / len(columns) for i in range(length)]
    return " → ".join(f"{100 * v:.1f}" for v in means)


def unwrap(text: str) -> str:
    """Config prose as markdown: the lines of a paragraph or list item joined (YAML wraps them at
    its own width; the figures filled in change the lengths), blank lines, items and table rows kept."""
    out: list[str] = []
    for line in text.strip().splitlines():
        line = line.strip()
        if (
            not line
            or line.startswith(("- ", "* ", "|"))
            or not out
            or not out[-1]
            or out[-1].startswith("|")
        ):
            out.append(line)
        else:
            out[-1] += " " + line
    return "\n".join(out)


def fill(text: str, config: ExperimentConfig, records: list[dict[str, Any]]) -> str:
    """The text, unwrapped, with every {{…}} placeholder replaced by its figure (see the module's
    docstring)."""
    text = unwrap(text)

    def one(m: re.Match[str]) -> str:
        body = m.group(1).strip()
        what, sep, where = body.partition("@")
        if not sep:
            raise ConfigError(f"{config.name}: placeholder '{{{{{body}}}}}' needs 'metric @ key=value'")
        what = what.strip()
        if what.startswith("verdict:"):
            return _verdict(config, records, what.removeprefix("verdict:").strip(), where)
        if what == "learned":
            return _learned_text(config, records, where)
        if what.startswith("series:"):
            return _series(what.removeprefix("series:"), _cell_records(config, records, where))
        if what == "n":
            return str(len(_cell_records(config, records, where)))
        parts = re.split(r"\s+-\s+", where.strip())
        if len(parts) == 2:
            a, b = (_values(what, _cell_records(config, records, p)) for p in parts)
            if not a or not b:
                return "–"
            diff = sum(a) / len(a) - sum(b) / len(b)
            text = _number(what, abs(diff))
            return ("+" if diff >= 0 else "−") + text
        return stat(what, _values(what, _cell_records(config, records, where)), with_n=False)

    return PLACEHOLDER.sub(one, text)


CLAIM = re.compile(
    r"^(?P<a>.+?)\s+-\s+(?P<b>.+?)\s*(?P<op>[<>])\s*(?P<threshold>[-−+]?\d+(?:\.\d+)?)\s*$", re.DOTALL
)
# `A > δ`: one cell's per-seed values against a threshold (e.g. what its rounds added, accuracy_gain)
ONE_CELL_CLAIM = re.compile(
    r"^(?P<a>[^<>]+?)\s*(?P<op>[<>])\s*(?P<threshold>[-−+]?\d+(?:\.\d+)?)\s*$", re.DOTALL
)


def _scale(metric: str) -> float:
    """A threshold is written in the metric's table units: points for a percentage."""
    return 100.0 if metric in PERCENT else 1.0


def _by_seed(metric: str, done: list[dict[str, Any]]) -> dict[int, float]:
    out = {}
    for r in done:
        value = metrics_of(r).get(metric)
        if value is not None:
            out[int(r.get("seed", (r.get("options") or {}).get("seed", 0)))] = value
    return out


def _has_learned(metric: str, done: list[dict[str, Any]]) -> bool | None:
    """verdicts.learned on a cell's records: the best version's accuracy for a best_* metric, else the
    final version's with its collapse flags; None when the records have no majority-class rate."""
    majority = _values("majority_rate", done)
    if not majority:
        return None
    version = "best" if metric.startswith("best_") else "final"
    collapsed = [] if version == "best" else _values("collapsed", done)
    classes = _values("num_classes", done)  # every seed of a cell has the same test split
    return learned(
        _values(f"{version}_accuracy", done),
        max(majority),
        collapsed,
        _values(f"{version}_macro_f1", done),
        int(max(classes)) if classes else None,
    )


def _verdict(config: ExperimentConfig, records: list[dict[str, Any]], metric: str, where: str) -> str:
    """`{{verdict: METRIC @ A - B > δ}}` (δ in the table's units, points for a percentage): the computed
    verdict (sim/experiments/verdicts.py) with the paired difference and its 95 % interval; `A > δ`
    (or `<`) judges one cell's per-seed values the same way."""
    m = CLAIM.match(where.strip()) or ONE_CELL_CLAIM.match(where.strip())
    if m is None:
        raise ConfigError(
            f"{config.name}: verdict '{where.strip()}' must read 'A - B > δ', 'A - B < δ', 'A > δ' or 'A < δ'"
        )
    threshold = float(m["threshold"].replace("−", "-")) / _scale(metric)
    names = ("A", "B") if "b" in m.groupdict() else ("A",)
    cells = [_cell_records(config, records, m[k.lower()]) for k in names]
    by_seed = [_by_seed(metric, done) for done in cells]
    diffs = paired(*by_seed) if len(cells) == 2 else [v for _, v in sorted(by_seed[0].items())]
    if not diffs:
        return "–"
    not_learned = [
        name for name, done in zip(names, cells, strict=True) if _has_learned(metric, done) is False
    ]
    iv = t_interval(diffs)
    unit = " points" if metric in PERCENT else ""

    def signed(x: float) -> str:
        return ("+" if x >= 0 else "−") + _number(metric, abs(x))

    spread = f"95 % CI {signed(iv.low)} to {signed(iv.high)}, " if iv.n > 1 else ""
    figures = f"{signed(iv.mean)}{unit}, {spread}{iv.n} seed{'s' if iv.n > 1 else ''}"
    if not_learned:
        which = {
            ("A",): "the first cell" if len(cells) == 2 else "the cell",
            ("B",): "the second cell",
            ("A", "B"): "both cells",
        }
        return f"{NOT_LEARNED} ({which[tuple(not_learned)]}; {figures})"
    return f"{verdict(diffs, m['op'], threshold)} ({figures})"


def _learned_text(config: ExperimentConfig, records: list[dict[str, Any]], where: str) -> str:
    """`{{learned @ cell}}`: learned / not learned by verdicts.learned, with the accuracy's interval
    and the majority-class rate."""
    done = _cell_records(config, records, where)
    accuracy = _values("final_accuracy", done)
    majority = _values("majority_rate", done)
    if not accuracy or not majority:
        return "–"
    word = "learned" if _has_learned("final_accuracy", done) else NOT_LEARNED
    iv = t_interval(accuracy)
    low, high = (_number("final_accuracy", v).replace("-", "−") for v in (iv.low, iv.high))
    spread = f", 95 % CI {low} to {high}" if iv.n > 1 else ""
    collapsed = sum(c > 0 for c in _values("collapsed", done))
    fell = f", {collapsed} of {len(done)} collapsed" if collapsed else ""
    f1 = _values("final_macro_f1", done)
    f1_text = f", macro-F1 {_number('final_macro_f1', sum(f1) / len(f1))} %" if f1 else ""
    # the rule compares with the highest of the seeds' majority rates (their test subsets differ)
    most = "" if min(majority) == max(majority) else "up to "
    return (
        f"{word} ({_number('final_accuracy', iv.mean)} %{spread}, majority "
        f"{most}{_number('majority_rate', max(majority))} %{f1_text}{fell})"
    )


def _cells_text(cells: list[dict[str, Any]]) -> str:
    def value(v: Any) -> str:
        return f"`{v}`" if isinstance(v, str) and " " in v else str(v)

    return "; ".join(", ".join(f"{k}={value(v)}" for k, v in c.items()) for c in cells)
