"""docs/configuration.md is what docs/gen_configuration.py writes from the code; the docs' links resolve."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from fedprompt.sim.experiments.findings import anchor_of

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


def test_links_of_the_readme_and_docs_resolve() -> None:
    """Every relative link of README.md and docs/*.md names a file (and a heading) that exists."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#") and not target[1:]:
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and resolved.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", resolved.read_text(), re.M)
                if anchor not in {anchor_of(h) for h in headings}:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
