"""Experiment configs (YAML): a grid of `fedprompt simulate` runs, expanded into cells. No I/O besides reading."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator


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
    """A number from the paper for the cells that match."""

    model_config = ConfigDict(extra="forbid")
    match: dict[str, Any]
    value: str


class ExperimentConfig(BaseModel):
    """One experiment: the simulate options every cell shares, the grid, seeds and how to report it."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=r"^[a-z0-9][a-z0-9_-]*$")
    title: str
    description: str = ""
    base: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    extra_cells: list[dict[str, Any]] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    warm_start: WarmStart | None = None
    table: TableSpec = Field(default_factory=TableSpec)
    plots: list[PlotSpec] = Field(default_factory=list)
    paper: list[PaperValue] = Field(default_factory=list)
    paper_note: str = "see paper"

    @field_validator("grid")
    @classmethod
    def _grid(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"grid.{key} must be a non-empty list")
        return v


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
            cells.append(
                Cell(params=params, options={**config.base, **params, "seed": seed}, seed=seed, id=cid)
            )
    return cells


def matches(params: dict[str, Any], pattern: dict[str, Any]) -> bool:
    """True when every key of the pattern has the same value (compared as text) in params."""
    return all(str(params.get(k)) == str(v) for k, v in pattern.items())
