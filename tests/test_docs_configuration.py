"""docs/configuration.md is what docs/gen_configuration.py writes from the code (Settings and the CLIs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_configuration", ROOT / "docs" / "gen_configuration.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_page_matches_the_code() -> None:
    gen = _generator()
    assert (ROOT / "docs" / "configuration.md").read_text() == gen.render(), (
        "docs/configuration.md is out of date: run `python docs/gen_configuration.py`"
    )


def test_every_coordinator_setting_is_described() -> None:
    from fedprompt.coordinator.config import Settings

    gen = _generator()
    page = (ROOT / "docs" / "configuration.md").read_text()
    for name, info in Settings.model_fields.items():
        assert info.description or name in gen.FALLBACK, f"Settings.{name} has no description"
        assert f"`FEDPROMPT_{name.upper()}`" in page
    assert not set(gen.FALLBACK) - set(Settings.model_fields), "FALLBACK names a setting that is gone"
