"""Every prompt method on every model family (tiny random models): forward, backward, state, averaging.

Matrix: {BertForMaskedLM, RobertaForMaskedLM, GPT2LMHeadModel, T5ForConditionalGeneration} x
{prompt tuning, P-tuning (MLP), P-tuning (LSTM), prefix tuning, prefix tuning with projection}. Every pair
makes sense and runs; the one refused combination is prefix tuning on DistilBERT, whose attention takes no
key/value cache (tested below).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from fedprompt.coordinator.logic.aggregation import fedavg
from fedprompt.shared import wire
from fedprompt.shared.methods import MethodError
from fedprompt.shared.spec import FederationSpec
from fedprompt.worker.data import Example
from fedprompt.worker.engine import PromptEngine, resolve_model
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    DistilBertConfig,
    DistilBertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaForMaskedLM,
    T5Config,
    T5ForConditionalGeneration,
)

NV = 3
WORDS = [["terrible"], ["great"]]
TEMPLATES = {
    "masked_lm": "{text} It was [MASK].",
    "causal_lm": "{text} It was [MASK]",
    "seq2seq": "{text} It was [MASK].",
}
EXAMPLES = [
    Example("a wonderful moving film", 1),
    Example("dull and lifeless", 0),
    Example("one of the best of the year", 1),
    Example("a waste of time", 0),
    Example("great acting and a clever script", 1),
    Example("the plot makes no sense at all", 0),
]
VOCAB_WORDS = sorted(
    {w for ex in EXAMPLES for w in ex.text.split()} | {"it", "was", ".", "terrible", "great", "movie", "bad"}
)

METHODS: dict[str, dict[str, Any]] = {
    "prompt_tuning": {"method": "prompt_tuning"},
    "p_tuning_mlp": {"method": "p_tuning", "encoder_type": "mlp", "encoder_hidden_size": 16},
    "p_tuning_lstm": {"method": "p_tuning", "encoder_type": "lstm", "encoder_hidden_size": 8},
    "prefix_tuning": {"method": "prefix_tuning"},
    "prefix_projection": {"method": "prefix_tuning", "prefix_projection": True, "encoder_hidden_size": 16},
}


def word_tokenizer(kind: str) -> PreTrainedTokenizerFast:
    """A tiny word-level tokenizer with the special tokens of a RoBERTa, GPT-2 or T5 tokenizer."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    specials = {
        "roberta": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        "gpt2": ["<|endoftext|>", "<unk>"],
        "t5": ["<pad>", "</s>", "<unk>", "<extra_id_0>"],
    }[kind]
    vocab = {tok: i for i, tok in enumerate(specials + VOCAB_WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if kind == "roberta":
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])]
        )
        names = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "mask_token": "<mask>"}
    elif kind == "t5":
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
        names = {"eos_token": "</s>", "pad_token": "<pad>", "additional_special_tokens": ["<extra_id_0>"]}
    else:
        names = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", **names)


def tiny_model(kind: str, seed: int = 0) -> tuple[torch.nn.Module, Any]:
    """A seeded tiny random model of a family and a tokenizer for it."""
    torch.manual_seed(seed)
    if kind == "bert":
        tok = AutoTokenizer.from_pretrained(resolve_model("all-MiniLM-L6-v2"))
        cfg = BertConfig(
            vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=128, initializer_range=0.2,
        )  # fmt: skip
        return BertForMaskedLM(cfg), tok
    tok = word_tokenizer("gpt2" if kind == "llama" else kind)
    if kind == "roberta":
        cfg = RobertaConfig(
            vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=130, pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, initializer_range=0.2,
        )  # fmt: skip
        return RobertaForMaskedLM(cfg), tok
    if kind == "gpt2":
        cfg = GPT2Config(
            vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=128,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, initializer_range=0.2,
        )  # fmt: skip
        return GPT2LMHeadModel(cfg), tok
    if kind == "llama":  # grouped-query attention: 4 query heads share 2 key/value heads (kv width 16)
        cfg = LlamaConfig(
            vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, initializer_range=0.2,
        )  # fmt: skip
        return LlamaForCausalLM(cfg), tok
    cfg = T5Config(
        vocab_size=len(tok), d_model=32, d_kv=16, num_heads=2, d_ff=64, num_layers=2,
        decoder_start_token_id=tok.pad_token_id, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    return T5ForConditionalGeneration(cfg), tok


FAMILY = {
    "bert": "masked_lm",
    "roberta": "masked_lm",
    "gpt2": "causal_lm",
    "llama": "causal_lm",
    "t5": "seq2seq",
}
KV_SIZE = {"llama": 16}  # the key/value width where it is not the hidden size (grouped-query attention)


def make_engine(kind: str, method: str, *, seed: int = 0, init: str = "vocab") -> PromptEngine:
    """An engine with a method around a tiny model (the same model for the same kind and seed)."""
    model, tok = tiny_model(kind)
    return PromptEngine.from_model(
        model, tok, template=TEMPLATES[FAMILY[kind]], verbalizer=WORDS, num_virtual_tokens=NV,
        max_length=32, device="cpu", seed=seed, init=init, **METHODS[method],
    )  # fmt: skip


def frozen_state(engine: PromptEngine) -> dict[str, torch.Tensor]:
    """A copy of every frozen PLM tensor."""
    return {
        f"{i}.{name}": t.detach().clone()
        for i, m in enumerate(engine.frozen_modules())
        for name, t in m.state_dict().items()
    }


MATRIX = [(kind, method) for kind in ("bert", "roberta", "gpt2", "llama", "t5") for method in METHODS]


@pytest.mark.parametrize(("kind", "method"), MATRIX, ids=[f"{k}-{m}" for k, m in MATRIX])
def test_method_on_family(kind: str, method: str) -> None:
    """Forward, backward, only the method's tensors change, wire round trip, two clients average and load."""
    # Prepare
    engine = make_engine(kind, method)
    assert engine.family == FAMILY[kind]
    spec = FederationSpec(
        template=TEMPLATES[FAMILY[kind]], family=FAMILY[kind], hidden_size=32, num_layers=2,
        kv_size=KV_SIZE.get(kind), num_virtual_tokens=NV, **METHODS[method],
    )  # fmt: skip
    assert engine.method_config.kv_size == KV_SIZE.get(kind)
    assert engine.tensor_shapes() == spec.tensor_shapes()
    frozen_before = frozen_state(engine)
    method_before = engine.get_prompt()

    # Forward and backward: every communicated tensor gets a gradient, no frozen tensor does.
    ids, mask, pos = engine._batch(EXAMPLES[:4])
    scores = engine.scores(ids, mask, pos)
    assert scores.shape == (4, 2) and bool(torch.isfinite(scores).all())
    torch.nn.functional.cross_entropy(scores, torch.tensor([1, 0, 1, 0])).backward()
    for name, param in engine.trainable_parameters().items():
        assert param.grad is not None and float(param.grad.abs().sum()) > 0, name
    assert all(not p.requires_grad for m in engine.frozen_modules() for p in m.parameters())

    # Training changes exactly the method's tensors.
    result = engine.train(EXAMPLES, steps=3, batch_size=4, lr=0.05)
    assert np.isfinite(result.mean_loss)
    after = engine.get_prompt()
    assert set(after) == set(spec.tensor_shapes())
    assert all(not np.array_equal(after[n], method_before[n]) for n in after)
    frozen_after = frozen_state(engine)
    assert all(torch.equal(frozen_before[k], frozen_after[k]) for k in frozen_before)

    # Safetensors round trip into a second client with the same model, exact.
    blob = engine.save_prompt(
        {"method": spec.method, "model_fingerprint": engine.fingerprint, "num_samples": 6}
    )
    wire.decode_checked(blob, spec.tensor_shapes())
    other = make_engine(kind, method, seed=1)
    assert not np.array_equal(other.get_prompt()[next(iter(after))], after[next(iter(after))])
    meta = other.load_prompt(blob, check_fingerprint=True)
    assert meta["method"] == spec.method
    assert all(np.array_equal(other.get_prompt()[n], after[n]) for n in after)
    torch.testing.assert_close(other.scores(ids, mask, pos), engine.scores(ids, mask, pos), rtol=0, atol=0)

    # Two clients train differently; the coordinator's FedAvg of their tensors loads back into an engine.
    other.train(EXAMPLES[::-1], steps=2, batch_size=3, lr=0.05, seed=7)
    first, second = wire.decode(engine.save_prompt())[0], wire.decode(other.save_prompt())[0]
    average = fedavg([(first, 6.0), (second, 2.0)])
    for name in average:
        np.testing.assert_allclose(
            average[name], 0.75 * first[name] + 0.25 * second[name], rtol=1e-6, atol=1e-7
        )
    wire.validate(average, spec.tensor_shapes())
    engine.set_prompt(average)
    assert all(np.array_equal(engine.get_prompt()[n], average[n]) for n in average)
    assert bool(torch.isfinite(engine.scores(ids, mask, pos)).all())


@pytest.mark.parametrize("kind", ["bert", "gpt2", "t5"])
def test_random_init_is_the_federations_version_zero(kind: str) -> None:
    """init='random' draws every tensor of a method from the same stream as the coordinator's version 0."""
    from fedprompt.shared.spec import initial_prompt

    engine = make_engine(kind, "p_tuning_mlp", init="random")
    spec = FederationSpec(hidden_size=32, num_virtual_tokens=NV, init_std=0.5, **METHODS["p_tuning_mlp"])
    engine2 = PromptEngine.from_model(
        tiny_model(kind)[0], tiny_model(kind)[1], template=TEMPLATES[FAMILY[kind]], verbalizer=WORDS,
        num_virtual_tokens=NV, max_length=32, device="cpu", init="random", init_std=0.5, **METHODS["p_tuning_mlp"],
    )  # fmt: skip
    assert engine.tensor_shapes() == spec.tensor_shapes()
    version0 = initial_prompt(spec)
    assert all(np.array_equal(engine2.get_prompt()[n], version0[n]) for n in version0)


def test_causal_template_reads_the_token_after_the_text() -> None:
    """For a causal LM the label word is predicted at the last token before [MASK]; nothing after it is kept."""
    engine = make_engine("gpt2", "prompt_tuning")
    encoded = engine.template.encode([Example("a waste of time", 0)])
    ids = encoded.input_ids[0]
    assert engine.tokenizer.convert_ids_to_tokens(ids) == ["a", "waste", "of", "time", "it", "was"]
    assert encoded.mask_positions == [len(ids) - 1]


def test_seq2seq_template_uses_the_first_sentinel() -> None:
    """For T5 [MASK] becomes <extra_id_0> and the encoder input ends with </s>."""
    engine = make_engine("t5", "prompt_tuning")
    ids = engine.template.encode([Example("a waste of time", 0)]).input_ids[0]
    tokens = engine.tokenizer.convert_ids_to_tokens(ids)
    assert tokens[-3:] == ["<extra_id_0>", ".", "</s>"]


def test_prefix_tuning_is_refused_where_attention_takes_no_cache() -> None:
    """DistilBERT's attention takes no past key/values: prefix tuning is refused with the reason."""
    tok = AutoTokenizer.from_pretrained(resolve_model("all-MiniLM-L6-v2"))
    model = DistilBertForMaskedLM(
        DistilBertConfig(
            vocab_size=len(tok), dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64
        )
    )
    with pytest.raises(MethodError, match="no key/value cache"):
        PromptEngine.from_model(
            model, tok, template=TEMPLATES["masked_lm"], verbalizer=WORDS, num_virtual_tokens=NV,
            max_length=32, device="cpu", method="prefix_tuning",
        )  # fmt: skip


def test_spec_refuses_prefix_tuning_without_layers() -> None:
    """The spec cannot name prefix tensors without the model's number of layers."""
    with pytest.raises(ValueError, match="num_layers"):
        FederationSpec(method="prefix_tuning")


@pytest.mark.parametrize("kind", ["gpt2", "t5"])
def test_mean_pool_scoring_needs_an_encoder(kind: str) -> None:
    model, tok = tiny_model(kind)
    with pytest.raises(ValueError, match="mean-pool scoring needs an encoder"):
        PromptEngine.from_model(
            model, tok, template="{text} It was [MASK].", verbalizer=[["bad"], ["good"]], scoring="mean-pool"
        )
