"""The operator's dashboard: Jinja2 templates, static files (uPlot vendored) and the page's data."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.templating import Jinja2Templates
from fedprompt.coordinator.dashboard.view import federation_detail, federation_row, pick_federation
from fedprompt.coordinator.service import Coordinator

HERE = Path(__file__).resolve().parent
TEMPLATES_DIR = HERE / "templates"
STATIC_DIR = HERE / "static"
NONE = "—"


def fmt_num(value: Any, digits: int = 3) -> str:
    """A number for people; '—' when absent."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return NONE
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def fmt_pct(value: Any, digits: int = 1) -> str:
    """A fraction as a percentage; '—' when absent."""
    if not isinstance(value, int | float) or not math.isfinite(value):
        return NONE
    return f"{100.0 * value:.{digits}f} %"


def fmt_bytes(value: Any) -> str:
    """A byte count with a binary unit; '—' when absent."""
    if not isinstance(value, int | float):
        return NONE
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # pragma: no cover - loop always returns


def fmt_duration(seconds: Any) -> str:
    """Seconds as '42 s', '3 m 05 s' or '2 h 01 m'; '—' when absent."""
    if not isinstance(seconds, int | float):
        return NONE
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} m {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} m"


def fmt_time(ts: Any) -> str:
    """A UNIX time as UTC ISO 8601; '—' when absent."""
    if not isinstance(ts, int | float):
        return NONE
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def make_templates() -> Jinja2Templates:
    """The dashboard's Jinja2 environment (autoescaping on) with its filters."""
    templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
    templates.env.filters.update(
        num=fmt_num, pct=fmt_pct, bytes=fmt_bytes, duration=fmt_duration, utc=fmt_time
    )
    return templates


def page_data(
    service: Coordinator, refused: Callable[[int], dict[int, int]], wanted: int | None
) -> dict[str, Any]:
    """The federation list and the chosen federation's detail, read through the service."""
    statuses = service.reads.list_federations()
    fid = pick_federation(statuses, wanted)
    now = service.clock()
    detail = None
    if fid is not None:
        status = next(s for s in statuses if s["id"] == fid)
        detail = federation_detail(
            status,
            service.reads.rounds(fid),
            service.reads.list_clients(fid),
            service.reads.evaluations(fid, 0),
            refused(fid),
            now,
        )
        detail["sites"] = service.reads.site_table(fid)
    return {
        "federations": [federation_row(s) for s in statuses],
        "selected": fid,
        "d": detail,
        "now": now,
    }
