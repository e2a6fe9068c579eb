"""What every benchmark shares: machine description, load, process CPU/RSS readings, result files, page blocks."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from fedprompt.shared.local import cpu_model

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
_TICK = os.sysconf("SC_CLK_TCK")


def machine() -> dict[str, Any]:
    """The machine a result was measured on, with its load (other jobs share the CPUs)."""
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        mem_kib = int(next(ln for ln in meminfo if ln.startswith("MemTotal")).split()[1])
    except (OSError, StopIteration, ValueError):
        mem_kib = 0
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": np.__version__,
        "commit": commit,
        "loadavg": list(os.getloadavg()),
    }


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation), None for no values."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


def ratio(value: float | None, baseline: float | None) -> float | None:
    """value / baseline, None where either is missing or the baseline is zero."""
    if value is None or baseline is None or baseline == 0:
        return None
    return value / baseline


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def proc_peak_rss_mib(pid: int) -> float:
    """Peak resident set size of a live process (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def self_peak_rss_mib() -> float:
    """Peak RSS of this process, MiB."""
    return proc_peak_rss_mib(os.getpid())


def write_result(name: str, payload: dict[str, Any], *, out_dir: Path | None = None) -> Path:
    """Write bench/results/<name>.json with the command, the machine and its load at the end."""
    out = (out_dir or RESULTS) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    module = spec.name if spec is not None and spec.name.startswith("bench.") else f"bench.{name}"
    doc = {
        "benchmark": name,
        "command": " ".join([Path(sys.executable).name, "-m", module, *sys.argv[1:]]),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        **payload,
    }
    out.write_text(json.dumps(doc, indent=2, default=float) + "\n")
    return out


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Min, median and max of the values that are present (None where there are none), and the values."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return {"n": 0, "min": None, "median": None, "max": None, "values": []}
    return {
        "n": len(present),
        "min": min(present),
        "median": float(np.median(present)),
        "max": max(present),
        "values": present,
    }


def replace_block(text: str, name: str, table: str) -> str:
    """Put a table between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``."""
    pattern = re.compile(rf"(<!-- bench:{name} -->\n)(?:.*?\n)?(<!-- /bench:{name} -->)", re.S)
    return pattern.sub(lambda m: m.group(1) + table + "\n" + m.group(2), text)
