"""Model families behind one seam (worker/engine/families/): every family of the vocabulary has its
registered adapter, and a family added by registering one adapter class, here a toy defined in this file,
is loaded, trained and evaluated by the engine with nothing else changed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fedprompt.shared.vocab import PEFT_TASK_TYPES, Family
from fedprompt.worker.engine import PromptEngine, Template
from fedprompt.worker.engine.families import FamilyAdapter, adapter, detect, register, registry, unregister
from fedprompt.worker.engine.families.causal_lm import CausalLMAdapter
from fedprompt.worker.engine.families.masked_lm import MaskedLMAdapter
from fedprompt.worker.engine.families.seq2seq import Seq2SeqAdapter
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

from tests.worker.test_methods import EXAMPLES, TEMPLATES, WORDS, tiny_model, word_tokenizer

# ---------------------------------------------------------------- the real families


def test_the_registry_holds_exactly_the_vocabulary_families() -> None:
    assert set(Family) == set(registry())
    # the coordinator exports each family's prompts with its PEFT task type (no torch there)
    assert set(Family) == set(PEFT_TASK_TYPES)


@pytest.mark.parametrize(
    ("family", "cls"),
    [
        (Family.MASKED_LM, MaskedLMAdapter),
        (Family.CAUSAL_LM, CausalLMAdapter),
        (Family.SEQ2SEQ, Seq2SeqAdapter),
    ],
)
def test_each_family_has_its_adapter(family: Family, cls: type[FamilyAdapter]) -> None:
    found = adapter(family)
    assert type(found) is cls
    assert found.name == family
    assert found.peft_task_type == PEFT_TASK_TYPES[family]
    assert type(found).__module__ == f"fedprompt.worker.engine.families.{family.value}"


@pytest.mark.parametrize(
    ("kind", "family"), [("bert", "masked_lm"), ("gpt2", "causal_lm"), ("t5", "seq2seq")]
)
def test_a_model_is_detected_as_its_family(kind: str, family: str) -> None:
    model, _ = tiny_model(kind)
    assert detect(model.config, model) == family


def test_a_checkpoint_config_and_a_bare_encoder_are_detected() -> None:
    assert detect(GPT2Config(architectures=["GPT2LMHeadModel"])) == Family.CAUSAL_LM
    bare = BertModel(
        BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    )
    assert detect(bare.config, bare) == Family.MASKED_LM  # what no other family claims


def test_an_unknown_family_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown model family 'nope'"):
        adapter("nope")


# ---------------------------------------------------------------- a new family: one class, registered


class ToyLMAdapter(CausalLMAdapter):
    """A toy family: causal LMs whose config carries `toy_family`, read as causal LMs are. It keeps
    count of the label-word readings, so the test sees that the engine went through it."""

    name = "toy_lm"
    detect_rank = 5  # asked before the causal LMs, whose models it would otherwise be
    peft_task_type = (
        "CAUSAL_LM"  # not in shared.vocab.PEFT_TASK_TYPES: only the coordinator's export reads it
    )
    readings = 0

    def claims(self, config: Any, model: torch.nn.Module | None = None) -> bool:
        return bool(getattr(config, "toy_family", False))

    def word_logits(self, backbone: Any, out: Any, rows: Any, at: Any, word_ids: Any) -> torch.Tensor:
        type(self).readings += 1
        return super().word_logits(backbone, out, rows, at, word_ids)


@pytest.fixture
def toy_family() -> Iterator[FamilyAdapter]:
    register(ToyLMAdapter)
    ToyLMAdapter.readings = 0
    yield adapter(ToyLMAdapter.name)
    unregister(ToyLMAdapter.name)
    assert ToyLMAdapter.name not in registry()


def toy_model() -> tuple[GPT2LMHeadModel, Any]:
    torch.manual_seed(0)
    tok = word_tokenizer("gpt2")
    cfg = GPT2Config(
        vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=128, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, initializer_range=0.2, toy_family=True,
    )  # fmt: skip
    return GPT2LMHeadModel(cfg), tok


@pytest.mark.parametrize("method", ["prompt_tuning", "prefix_tuning"])
def test_a_registered_family_builds_and_trains(toy_family: FamilyAdapter, method: str) -> None:
    model, tok = toy_model()
    assert detect(model.config, model) == "toy_lm"
    engine = PromptEngine.from_model(
        model, tok, template=TEMPLATES["causal_lm"], verbalizer=WORDS, num_virtual_tokens=3, max_length=32,
        device="cpu", seed=0, method=method,
    )  # fmt: skip
    assert (engine.family, engine.head, engine.scoring) == ("toy_lm", "lm", "label-words")
    assert engine.template.family == "toy_lm" and engine.template.mask_id is None
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()}
    start = engine.get_prompt()

    before = engine.evaluate(EXAMPLES)
    result = engine.train(EXAMPLES, steps=3, batch_size=4, lr=0.1)
    after = engine.evaluate(EXAMPLES)

    assert result.steps == 3 and torch.isfinite(torch.tensor(result.mean_loss))
    assert after.loss != before.loss
    assert any((engine.get_prompt()[n] != start[n]).any() for n in start)
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters())
    assert ToyLMAdapter.readings >= 3 + 2  # three steps and two evaluations read the label words through it
    assert engine.model_parameters() == sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError, match="mean-pool scoring needs an encoder"):
        PromptEngine.from_model(
            model, tok, template=TEMPLATES["causal_lm"], verbalizer=WORDS, device="cpu", scoring="mean-pool"
        )


def test_a_registered_family_loads_from_a_folder(toy_family: FamilyAdapter, tmp_path: Path) -> None:
    model, tok = toy_model()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)

    engine = PromptEngine.load(
        str(tmp_path), template=TEMPLATES["causal_lm"], verbalizer=WORDS, num_virtual_tokens=3, max_length=32,
        device="cpu",
    )  # fmt: skip

    assert engine.family == "toy_lm"
    assert engine.train(EXAMPLES, steps=1, batch_size=4).steps == 1


def test_a_template_reads_the_answer_where_the_family_puts_it(toy_family: FamilyAdapter) -> None:
    _, tok = toy_model()
    toy = Template("{text} It was [MASK] indeed.", tok, 32, "toy_lm")
    causal = Template("{text} It was [MASK] indeed.", tok, 32, Family.CAUSAL_LM)
    assert toy.template == causal.template == "{text} It was [MASK]"  # what follows [MASK] is never read
    assert toy.encode(EXAMPLES[:2]) == causal.encode(EXAMPLES[:2])
