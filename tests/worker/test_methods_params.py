"""Parameter counts from configs alone, and the communication table docs/methods.md shows."""

from __future__ import annotations

from pathlib import Path

import pytest
from fedprompt.worker.engine.params import comm_table, count_parameters, load_config, markdown


def test_bert_base_prompt_tuning_reproduces_the_paper() -> None:
    """FedPrompt: 20 x 768 = 15,360 parameters per round, about 0.014 % of BERT-base (109.5M)."""
    rows = {(r.model, r.method): r for r in comm_table(("bert-base-uncased",), 20)}
    row = rows[("bert-base-uncased", "prompt tuning")]
    assert row.params_communicated == 15_360
    assert round(row.params_full_model / 1e6, 1) == 109.5
    assert f"{100 * row.comm_ratio:.3f}" == "0.014"
    assert rows[("bert-base-uncased", "prefix tuning")].params_communicated == 20 * 12 * 2 * 768
    # P-tuning's MLP encoder: embedding + 768->768->768->768 linear layers with biases.
    assert rows[("bert-base-uncased", "P-tuning (MLP)")].params_communicated == 15_360 + 3 * (768 * 768 + 768)


def test_meta_count_equals_the_loaded_models() -> None:
    """The meta-device count of the vendored MiniLM config equals the real checkpoint's parameter count."""
    from fedprompt.worker.engine import resolve_model
    from transformers import AutoModel

    real = AutoModel.from_pretrained(resolve_model("all-MiniLM-L6-v2"))
    assert count_parameters(load_config("all-MiniLM-L6-v2")) == sum(p.numel() for p in real.parameters())


@pytest.mark.parametrize(
    ("name", "expected"),
    [("roberta-base", 124_697_433), ("t5-base", 222_903_552), ("all-MiniLM-L6-v2", 22_713_216)],
)
def test_vendored_configs_give_the_published_sizes(name: str, expected: int) -> None:
    """RoBERTa-base 124.7M (with its MLM head), T5-base 222.9M, MiniLM-L6 22.7M."""
    assert count_parameters(load_config(name)) == expected


def test_markdown_has_a_row_per_model_and_method() -> None:
    """Four methods per model, thousands separators, percentages."""
    text = markdown(comm_table(("all-MiniLM-L6-v2",), 20))
    assert "| all-MiniLM-L6-v2 | 22,713,216 | prompt tuning | 7,680 | 0.0338 % |" in text
    assert len(text.splitlines()) == 2 + 4


def test_docs_methods_shows_the_computed_table() -> None:
    """docs/methods.md's communication table is what `fedprompt comm-table` prints."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "methods.md").read_text()
    assert markdown(comm_table()) in page
