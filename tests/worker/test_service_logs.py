"""A worker service's log is JSON lines only (issue 34): no tqdm "Loading weights" bar from transformers,
no plain "[transformers] ..." line, once the service set up its logging (worker/quiet.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import logging
from fedprompt.shared.logs import configure_logging
configure_logging("info", "json")
{quiet}
from fedprompt.worker.engine import PromptEngine
PromptEngine.load("sentence-transformers/all-MiniLM-L6-v2", template="{{text}} It was [MASK].",
                  verbalizer=[["bad"], ["good"]], num_virtual_tokens=4, max_length=16, device="cpu")
from transformers.utils import logging as hf_logging
hf_logging.get_logger("transformers.modeling_utils").warning("a warning of transformers")
logging.getLogger("fedprompt.worker").info("model loaded")
"""
QUIET = "from fedprompt.worker.quiet import quiet_third_party; quiet_third_party()"


def _log(quiet: bool) -> list[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(quiet=QUIET if quiet else "")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return [line for line in (done.stdout + done.stderr).replace("\r", "\n").splitlines() if line.strip()]


def _json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


@pytest.mark.parametrize("quiet", [False, True])
def test_a_service_log_holds_only_json_lines(quiet: bool) -> None:
    lines = _log(quiet)
    if not quiet:  # the check can fail: without the set-up transformers writes its own lines
        assert any(not _json(line) for line in lines), lines
        return
    assert lines and all(_json(line) for line in lines), [line for line in lines if not _json(line)]
    records = [json.loads(line) for line in lines]
    assert any(r["event"] == "a warning of transformers" for r in records)  # kept, as JSON
    assert any(r["event"] == "model loaded" for r in records)
