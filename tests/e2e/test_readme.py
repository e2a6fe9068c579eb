"""The README's curl walk-through runs as written against a real coordinator."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ADMIN, coordinator_process

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def walkthrough() -> str:
    text = (ROOT / "README.md").read_text()
    block = re.search(
        r"<!-- curl-walkthrough:start -->\s*```bash\n(.*?)```\s*<!-- curl-walkthrough:end -->", text, re.S
    )
    assert block, "README has no curl walk-through block"
    return block.group(1)


def test_readme_curl_walkthrough_runs(tmp_path: Path) -> None:
    with coordinator_process(f"sqlite:///{tmp_path / 'readme.db'}", tmp_path) as (url, _):
        env = {**os.environ, "FEDPROMPT_URL": url, "FEDPROMPT_ADMIN_TOKEN": ADMIN}
        done = subprocess.run(
            ["bash", "-c", walkthrough()], env=env, capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 0, done.stderr + done.stdout
    lines = done.stdout.strip().splitlines()
    assert sum(line.startswith('{"client_id"') for line in lines) == 2
    assert any('"round":1' in line and '"state":"open"' in line for line in lines)
    assert any('"state":"running"' in line and '"current_round":1' in line for line in lines)
