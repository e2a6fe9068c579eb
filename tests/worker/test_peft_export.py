"""The exported PEFT adapter, loaded with PeftModel.from_pretrained, predicts what the engine predicts."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from fedprompt.shared import wire
from fedprompt.shared.export import CONFIG_NAME, WEIGHTS_NAME, ExportError, peft_zip, unpack, write_peft
from fedprompt.shared.methods import MethodConfig, materialise
from fedprompt.shared.spec import FederationSpec

from tests.worker.test_methods import EXAMPLES, FAMILY, METHODS, NV, TEMPLATES, make_engine, tiny_model

MATRIX = [(kind, method) for kind in ("bert", "roberta", "gpt2", "t5") for method in METHODS]


def _spec(kind: str, method: str) -> FederationSpec:
    return FederationSpec(
        model=f"tiny-{kind}", template=TEMPLATES[FAMILY[kind]], family=FAMILY[kind], hidden_size=32,
        num_layers=2, num_attention_heads=2, num_virtual_tokens=NV, **METHODS[method],
    )  # fmt: skip


@pytest.mark.parametrize(("kind", "method"), MATRIX, ids=[f"{k}-{m}" for k, m in MATRIX])
def test_exported_adapter_predicts_like_the_engine(kind: str, method: str, tmp_path: Path) -> None:
    """Label-word logits of PeftModel.from_pretrained(base, export) equal the engine's to 1e-5."""
    from peft import PeftModel

    # Prepare: a trained engine; its communicated tensors go through the wire as the coordinator holds them.
    engine = make_engine(kind, method)
    engine.train(EXAMPLES, steps=2, batch_size=3, lr=0.05)
    spec = _spec(kind, method)
    tensors, _ = wire.decode_checked(engine.save_prompt(), spec.tensor_shapes())
    folder = tmp_path / "adapter"
    unpack(peft_zip(spec, tensors, version=3), folder)
    assert sorted(p.name for p in folder.iterdir()) == [CONFIG_NAME, WEIGHTS_NAME]

    # Execute: a fresh copy of the same base model with the adapter loaded by PEFT.
    base, _ = tiny_model(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = PeftModel.from_pretrained(base.eval(), str(folder))
    peft_model.eval()
    ids, mask, pos = engine._batch(EXAMPLES)
    rows = torch.arange(len(EXAMPLES))
    word_ids = torch.tensor(engine.verbalizer.word_ids)
    with torch.no_grad():
        if FAMILY[kind] == "seq2seq":
            start = torch.full((len(EXAMPLES), 1), base.config.decoder_start_token_id, dtype=torch.long)
            logits = peft_model(input_ids=ids, attention_mask=mask, decoder_input_ids=start).logits[:, 0]
        else:
            at = pos + (0 if spec.method == "prefix_tuning" else NV)
            logits = peft_model(input_ids=ids, attention_mask=mask).logits[rows, at]
        theirs = logits[:, word_ids]
        ours = engine.scores(ids, mask, pos)  # one word per label: scores are the label words' logits

    # Assert
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)
    assert theirs.abs().max() > 1e-3  # not two zero vectors
    config = json.loads((folder / CONFIG_NAME).read_text())
    assert config["peft_type"] == {"prompt_tuning": "PROMPT_TUNING", "p_tuning": "P_TUNING"}.get(
        spec.method, "PREFIX_TUNING"
    )


def test_numpy_encoders_match_peft() -> None:
    """materialise() (numpy) equals PEFT's PromptEncoder / PrefixEncoder forward for MLP, LSTM and projection."""
    from peft import PrefixEncoder, PrefixTuningConfig, PromptEncoder, PromptEncoderConfig

    torch.manual_seed(0)
    cases = [
        (
            MethodConfig("p_tuning", 4, 8, encoder_type="mlp", encoder_hidden_size=6),
            PromptEncoder(PromptEncoderConfig(num_virtual_tokens=4, token_dim=8, num_transformer_submodules=1,
                                              encoder_reparameterization_type="MLP", encoder_hidden_size=6)),
        ),
        (
            MethodConfig("p_tuning", 4, 8, encoder_type="lstm", encoder_hidden_size=5, encoder_num_layers=2),
            PromptEncoder(PromptEncoderConfig(num_virtual_tokens=4, token_dim=8, num_transformer_submodules=1,
                                              encoder_reparameterization_type="LSTM", encoder_hidden_size=5)),
        ),
        (
            MethodConfig("prefix_tuning", 4, 8, num_layers=3, prefix_projection=True, encoder_hidden_size=6),
            PrefixEncoder(PrefixTuningConfig(num_virtual_tokens=4, token_dim=8, num_layers=3, num_transformer_submodules=1,
                                             prefix_projection=True, encoder_hidden_size=6)),
        ),
    ]  # fmt: skip
    for cfg, module in cases:
        tensors = {f"prompt_encoder.{k}": v.detach().numpy() for k, v in module.state_dict().items()}
        with torch.no_grad():
            expected = module(torch.arange(4).unsqueeze(0))[0].numpy()
        np.testing.assert_allclose(materialise(cfg, tensors), expected, rtol=0, atol=1e-5)


def test_prefix_export_needs_attention_heads(tmp_path: Path) -> None:
    """Without num_attention_heads the prefix cannot be split into heads: a clear error, nothing written."""
    spec = FederationSpec(method="prefix_tuning", hidden_size=8, num_layers=2, num_virtual_tokens=2)
    tensors = {"prompt_embeddings": np.zeros((2, 32), np.float32)}
    with pytest.raises(ExportError, match="num_attention_heads"):
        write_peft(spec, tensors, tmp_path / "out")
    assert not (tmp_path / "out").exists()
