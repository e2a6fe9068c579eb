"""The curl walk-through of docs/api.md (linked from the README) runs as written against a real
coordinator, its two `fedprompt-worker serve` processes enrolling with the token it issued and training
every round. Only the sizes are cut (fewer local steps, examples and tokens), so that it takes about a
minute; each cut names the text it replaces, so an edit of the walk-through fails here first."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ADMIN, coordinator_process, free_port

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "api.md"
pytestmark = pytest.mark.slow

# (as written, what the test runs instead)
CUTS = [
    ('"local_steps": 50', '"local_steps": 2, "batch_size": 4, "max_length": 32'),
    ("--data sst2 ", "--data sst2 --train-limit 40 --eval-limit 40 --threads 1 --poll-wait 1 "),
    ('"$((8100 + i))"', '"$((PORT0 + i))"'),
    ("sleep 5", "sleep 1"),
]


def walkthrough() -> str:
    text = PAGE.read_text()
    block = re.search(
        r"<!-- curl-walkthrough:start -->\s*```bash\n(.*?)```\s*<!-- curl-walkthrough:end -->", text, re.S
    )
    assert block, f"{PAGE.name} has no curl walk-through block"
    return block.group(1)


def test_the_readme_links_the_walkthrough() -> None:
    assert "docs/api.md" in (ROOT / "README.md").read_text()


def test_walkthrough_ends_in_workers_joining_the_federation() -> None:
    script = walkthrough()
    assert "fedprompt-worker serve --coordinator" in script and '--enrollment-token "$ENROL"' in script
    assert "jq" in script


def test_walkthrough_runs_with_real_workers(tmp_path: Path) -> None:
    script = walkthrough()
    for written, instead in CUTS:
        assert written in script, f"the walk-through no longer has {written!r}; update CUTS"
        script = script.replace(written, instead)
    port0 = free_port()  # and the port after it, most likely free too
    with coordinator_process(f"sqlite:///{tmp_path / 'readme.db'}", tmp_path) as (url, _):
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "FEDPROMPT_COORDINATOR": url,
            "FEDPROMPT_URL": url,
            "FEDPROMPT_ADMIN_TOKEN": ADMIN,
            "PORT0": str(port0),
        }
        proc = subprocess.Popen(
            ["bash", "-c", script],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=480)
        finally:
            with contextlib.suppress(ProcessLookupError):  # the workers, whatever became of the script
                os.killpg(proc.pid, signal.SIGTERM)
    logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("worker-*.log")))
    assert proc.returncode == 0, err + out + logs
    lines = [json.loads(line) for line in out.strip().splitlines()]
    assert lines[0]["state"] == "waiting" and lines[0]["current_round"] in (0, None)
    clients = [line for line in lines if "name" in line]
    assert sorted(c["name"] for c in clients) == ["hospital-0", "hospital-1"]
    assert all(c["updates"] == 3 for c in clients)
    rounds = [line for line in lines if "round" in line]
    assert [(r["round"], r["state"]) for r in rounds] == [(1, "closed"), (2, "closed"), (3, "closed")]
    assert all(r["closed_by"] == "all-uploaded" and 0.0 <= r["accuracy"] <= 1.0 for r in rounds)
    assert (tmp_path / "prompt.safetensors").stat().st_size > 20 * 384 * 4
