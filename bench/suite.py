"""The test suite's wall time: `make test` on the idle machine, then again with CPU-bound processes beside it.

    python -m bench.suite [--busy 2] [--command "make test"]

Each run records the command's wall time and exit status, pytest's summary line (passed, failed,
errors, skipped, and the seconds pytest reports for itself) and the load average before and after.
The loaded run starts `--busy` Python processes that spin (`while True: pass`) before the command
and kills them after it, so the suite shares the cores with as many CPU-bound jobs; the load
average shows them. Goals (issue 39): the idle run within IDLE_GOAL_S, no failure in either run.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, write_result

IDLE_GOAL_S = 600.0
SUMMARY = re.compile(r"^=*\s*(?P<counts>\d+ \w+(?:, \d+ \w+)*) in (?P<seconds>[\d.]+)s", re.M)
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|warnings?)")


def pytest_summary(output: str) -> dict[str, Any]:
    """The counts and seconds of pytest's last summary line in a command's output (zeros if none)."""
    found = list(SUMMARY.finditer(output))
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    if not found:
        return {**counts, "pytest_s": None}
    last = found[-1]
    for number, kind in COUNT.findall(last["counts"]):
        key = "errors" if kind.startswith("error") else kind
        if key in counts:
            counts[key] = int(number)
    return {**counts, "pytest_s": float(last["seconds"])}


def spinners(n: int) -> list[subprocess.Popen[bytes]]:
    """n CPU-bound processes, each spinning on one core until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def run_once(command: list[str], busy: int, log: Path) -> dict[str, Any]:
    """One run of the command with `busy` spinning processes beside it."""
    load_start = list(os.getloadavg())
    beside = spinners(busy)
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    finally:
        for proc in beside:
            proc.kill()
            proc.wait()
    wall = time.perf_counter() - started
    output = done.stdout + done.stderr
    log.write_text(output)
    return {
        "busy_processes": busy,
        "wall_s": wall,
        "returncode": done.returncode,
        **pytest_summary(output),
        "loadavg_start": load_start,
        "loadavg_end": list(os.getloadavg()),
        "log": log.name,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--command", default="make test", help="the suite's command, as the README gives it")
    ap.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside the second run")
    ap.add_argument("--name", default="suite")
    ap.add_argument("--out-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    command = shlex.split(args.command)
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    runs = []
    for busy in (0, args.busy):
        print(f"{args.command} with {busy} busy processes beside it …", flush=True)
        run = run_once(command, busy, logs / f"bench-{args.name}-busy{busy}.log")
        print(
            f"  {run['wall_s']:.0f} s, exit {run['returncode']}, {run['passed']} passed, "
            f"{run['failed']} failed, {run['errors']} errors",
            flush=True,
        )
        runs.append(run)
    path = write_result(
        args.name,
        {"settings": {"command": args.command, "busy": args.busy, "idle_goal_s": IDLE_GOAL_S}, "runs": runs},
        out_dir=args.out_dir,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
