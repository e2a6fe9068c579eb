"""Experiment configs (YAML): a grid of `fedprompt simulate` runs, expanded into cells. No I/O besides reading."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class ConfigError(ValueError):
    """An experiment config that cannot run; the message names the field."""


class WarmStart(BaseModel):
    """A clean prompt every cell starts from: one client trains `steps` steps on a seeded subset."""

    model_config = ConfigDict(extra="forbid")
    steps: int = Field(400, ge=1)
    train_limit: int | None = Field(4000, ge=1)
    seed: int = Field(1, ge=0, description="Another seed than the cells': another train subset.")
    batch_size: int | None = Field(None, ge=1, description="Default: the cells' batch size.")


class TableSpec(BaseModel):
    """How the report pivots the cells: one row per `rows` combination, one column per `columns` × metric."""

    model_config = ConfigDict(extra="forbid")
    rows: list[str] = Field(default_factory=list)
    columns: list[str] = Field(default_factory=list)
    metrics: list[str] = Field(default_factory=lambda: ["final_accuracy"])
    labels: dict[str, str] = Field(
        default_factory=dict, description="Column names of metrics where the default reads wrong here."
    )
    unset: dict[str, str] = Field(
        default_factory=dict,
        description="How a row or column key reads where a cell leaves it unset (default 'off'), "
        'e.g. {template: "ours (the data set\'s)"}.',
    )


class PlotSpec(BaseModel):
    """A figure: `asr` (per-round ASR of one cell) or `lines` (a metric against a grid key)."""

    model_config = ConfigDict(extra="forbid")
    kind: str
    file: str
    cell: dict[str, Any] = Field(default_factory=dict, description="asr: which cell (grid values).")
    x: str | None = None
    y: str = "final_accuracy"
    series: str | None = None
    title: str = ""

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in ("asr", "lines"):
            raise ValueError("plot kind must be 'asr' or 'lines'")
        return v


class PaperValue(BaseModel):
    """A figure the paper reports (../shared/PAPER.md), shown beside the cells it matches.

    `value`: a number (a percentage, as the paper prints it) or a short text where the paper gives
    no number (e.g. what Fig. 6 shows). `metric`: the column of ours it sits beside (one of the
    table's metrics); without it, the row's "paper" column. `match`: the grid values of the cells it
    belongs to; without it, no cell here measures it and the report lists it under the table.
    `model` and `size`: what the paper measured it with (size: where it differs from the config's
    `paper_size`)."""

    model_config = ConfigDict(extra="forbid")
    source: str = Field(..., min_length=1, description="Where in the paper, e.g. 'Table I'.")
    model: str = Field(..., min_length=1, description="The paper's model: BERT, RoBERTa, T5.")
    value: float | str
    metric: str | None = None
    match: dict[str, Any] | None = None
    size: str | None = None


class ExperimentConfig(BaseModel):
    """One experiment: the simulate options every cell shares, the grid, seeds and how to report it."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=r"^[a-z0-9][a-z0-9_-]*$")
    title: str
    description: str = ""
    base: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    extra_cells: list[dict[str, Any]] = Field(default_factory=list)
    by_dataset: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Options per data set (e.g. a template and label words that suit it), applied to "
        "every cell of that data set after base and before the cell's own grid values.",
    )
    variants: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Named bundles of options (e.g. a method: its drift correction, fraction and local "
        "steps together); a grid or extra cell names one with its 'variant' key.",
    )
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    warm_start: WarmStart | None = None
    table: TableSpec = Field(default_factory=TableSpec)
    plots: list[PlotSpec] = Field(default_factory=list)
    paper: list[PaperValue] = Field(default_factory=list)
    paper_size: str = Field(
        "", description="The paper's setup for its figures here (model sizes, rounds, steps)."
    )
    reading: str = Field(
        "",
        description="What the table shows, below it in RESULTS.md. Measured figures as placeholders "
        "({{metric @ key=value, …}}, see report.py), never typed in.",
    )
    section: str = Field("", description="The RESULTS.md heading the experiment goes under.")
    order: int = Field(100, description="Its place in RESULTS.md (then the name).")

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v) or any(s < 0 for s in v):
            raise ValueError("seeds must be distinct non-negative integers, e.g. [0, 1, 2]")
        return v

    @model_validator(mode="after")
    def _paper(self) -> ExperimentConfig:
        known = set(self.grid) | set(self.base) | {k for c in self.extra_cells for k in c}
        cells = [{**self.base, **c.params} for c in expand(self)]
        for n, entry in enumerate(self.paper):
            where = f"paper[{n}] ({entry.source}, {entry.model})"
            if entry.metric is not None and entry.metric not in self.table.metrics:
                raise ValueError(
                    f"{where}: metric '{entry.metric}' is not one of table.metrics {self.table.metrics}"
                )
            if entry.match is None:
                continue
            unknown = sorted(set(entry.match) - known)
            if unknown:
                raise ValueError(f"{where}: match names {unknown}, not a key of base, grid or extra_cells")
            if not any(matches(c, entry.match) for c in cells):
                raise ValueError(
                    f"{where}: match {entry.match} matches no cell (leave match out for a figure no cell measures)"
                )
        return self

    @field_validator("grid")
    @classmethod
    def _grid(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"grid.{key} must be a non-empty list")
        return v

    @model_validator(mode="after")
    def _variants(self) -> ExperimentConfig:
        named = {str(v) for v in self.grid.get("variant", [])} | {
            str(c["variant"]) for c in self.extra_cells if "variant" in c
        }
        unknown = sorted(named - set(self.variants))
        if unknown:
            raise ValueError(
                f"variant {unknown} is not defined under variants (defined: {sorted(self.variants)})"
            )
        return self


@dataclass(frozen=True)
class Cell:
    """One simulate run: its grid values (what varies), all its options and its folder name."""

    params: dict[str, Any]
    options: dict[str, Any]
    seed: int
    id: str = field(default="")


def load_config(path: Path) -> ExperimentConfig:
    """Parse and validate an experiment YAML file."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    try:
        return ExperimentConfig.model_validate(data)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _slug(value: Any) -> str:
    text = str(value).lower()
    return re.sub(r"[^a-z0-9.]+", "-", text).strip("-") or "x"


def cell_id(params: dict[str, Any], seed: int) -> str:
    """A readable, stable folder name for a cell, e.g. 'malicious-1_aggregation-median_attack-boost-10_seed-0'."""
    parts = [f"{_slug(k)}-{_slug(v)}" for k, v in params.items()]
    return "_".join([*parts, f"seed-{seed}"])


def expand(config: ExperimentConfig) -> list[Cell]:
    """The extra (reference) cells, then every cell of the grid (cartesian product, in config order), per seed."""
    keys = list(config.grid)
    combos = [dict(zip(keys, values, strict=True)) for values in itertools.product(*config.grid.values())]
    extra = [{k: c.get(k, config.base.get(k)) for k in keys} | c for c in config.extra_cells]
    cells: list[Cell] = []
    seen: set[str] = set()
    for params in [*extra, *combos]:  # reference cells first: a grid cut short still has them
        for seed in config.seeds:
            cid = cell_id(params, seed)
            if cid in seen:
                continue
            seen.add(cid)
            dataset = str(params.get("dataset", config.base.get("dataset")))
            bundle = config.variants.get(str(params.get("variant")), {})
            own = {k: v for k, v in params.items() if k != "variant"}
            options = {**config.base, **config.by_dataset.get(dataset, {}), **bundle, **own, "seed": seed}
            cells.append(Cell(params=params, options=options, seed=seed, id=cid))
    return cells


def matches(params: dict[str, Any], pattern: dict[str, Any]) -> bool:
    """True when every key of the pattern has the same value (compared as text) in params."""
    return all(str(params.get(k)) == str(v) for k, v in pattern.items())
