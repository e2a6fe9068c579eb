"""Third-party output in a service's log: transformers' and huggingface_hub's progress bars (tqdm, written
straight to stderr) are turned off, and transformers' own plain-text handler is replaced by the
process's log handler, so a worker's log stays one JSON object a line (shared/logs.py)."""

from __future__ import annotations

import logging
import os


def quiet_third_party() -> None:
    """No progress bars from transformers or huggingface_hub; their log records through the root logger
    (at warning and above). Call once, after configure_logging and before any model is loaded."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:  # pragma: no cover - the worker extra brings it
        pass
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover
        return
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_warning()
    hf_logging.disable_default_handler()  # its plain "[transformers] ..." lines
    hf_logging.enable_propagation()  # to the root logger's (JSON) handler instead
    logging.getLogger("huggingface_hub").propagate = True
