"""The prompt methods on the worker: HF PEFT's prompt encoders around the frozen PLM.

PEFT builds the trainable module (PromptEmbedding, PromptEncoder with an MLP or LSTM, PrefixEncoder) and
runs the forward pass (virtual tokens prepended to the input embeddings, or key/value prefixes handed to
every attention layer as a cache). The engine reads the label words from what PEFT returns. The wire
names of shared.methods map one to one onto the prompt encoder's parameters.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from fedprompt.shared.methods import PEFT_TASK_TYPES, MethodConfig, MethodError, peft_state_names
from fedprompt.worker.engine.model import Backbone
from torch import nn


def model_shape(config: Any) -> tuple[int, int, int]:
    """(hidden size, layers, attention heads) of a transformers config, as PEFT reads them."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = (
        getattr(text, "hidden_size", None) or getattr(text, "n_embd", None) or getattr(text, "d_model", 0)
    )
    layers = (
        getattr(text, "num_hidden_layers", None)
        or getattr(text, "num_layers", None)
        or getattr(text, "n_layer", 0)
    )
    heads = (
        getattr(text, "num_attention_heads", None)
        or getattr(text, "n_head", None)
        or getattr(text, "num_heads", 0)
    )
    return int(hidden), int(layers), int(heads)


def kv_size(config: Any) -> int | None:
    """Width of one layer's key/value states where it is not the hidden size (grouped-query attention:
    num_key_value_heads × head_dim, as PEFT sizes prefixes for it), else None."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    kv_heads = getattr(text, "num_key_value_heads", None)
    hidden, _, heads = model_shape(config)
    if not kv_heads or not heads:
        return None
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    size = int(kv_heads * head_dim)
    return None if size == hidden else size


def peft_config(cfg: MethodConfig, family: str, config: Any) -> Any:
    """The PEFT config of a method for a model (one set of virtual tokens, on the encoder side)."""
    from peft import PrefixTuningConfig, PromptEncoderConfig, PromptTuningConfig

    hidden, layers, heads = model_shape(config)
    common: dict[str, Any] = {
        "task_type": PEFT_TASK_TYPES[family],
        "num_virtual_tokens": cfg.num_virtual_tokens,
        "token_dim": hidden,
        "num_layers": layers,
        "num_attention_heads": heads,
        # Virtual tokens go to the encoder input only; prefixes of a seq2seq model go to the decoder's self-
        # and cross-attention (PEFT's default for seq2seq prefixes; the encoder takes no cache).
        "num_transformer_submodules": 2 if (family == "seq2seq" and cfg.method == "prefix_tuning") else 1,
    }
    if cfg.method == "prompt_tuning":
        return PromptTuningConfig(**common)
    if cfg.method == "p_tuning":
        return PromptEncoderConfig(
            **common,
            encoder_reparameterization_type=cfg.encoder_type.upper(),
            encoder_hidden_size=cfg.encoder_hidden,
            encoder_num_layers=cfg.encoder_num_layers,
            encoder_dropout=0.0,
        )
    if cfg.method == "prefix_tuning":
        if family == "masked_lm" and getattr(config, "model_type", "") in _NO_PREFIX_SUPPORT:
            raise MethodError(
                f"{config.model_type} attention takes no key/value cache, so prefix tuning cannot reach it"
            )
        return PrefixTuningConfig(
            **common, encoder_hidden_size=cfg.encoder_hidden, prefix_projection=cfg.prefix_projection
        )
    raise MethodError(f"unknown method {cfg.method!r}")


# Encoders whose attention layers accept no past key/values (checked: DistilBERT).
_NO_PREFIX_SUPPORT = frozenset({"distilbert"})


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # PEFT warns that FEATURE_EXTRACTION models and frozen bases are unusual; both are intended here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def wrap(backbone: Backbone, cfg: MethodConfig) -> tuple[nn.Module, nn.Module]:
    """(PeftModel around the backbone's runner, its prompt encoder) for a method."""
    from peft import get_peft_model

    with _quiet():
        model = get_peft_model(backbone.runner, peft_config(cfg, backbone.family, backbone.config))
    encoder = model.prompt_encoder["default"]
    names = set(peft_state_names(cfg).values())
    params = {name for name, _ in encoder.named_parameters()}
    if names != params:  # a PEFT whose encoder layout moved: the wire names would no longer load
        raise MethodError(f"PEFT's prompt encoder has parameters {sorted(params)}; expected {sorted(names)}")
    return model, encoder


def attach(
    backbone: Backbone, cfg: MethodConfig, *, seed: int, device: torch.device
) -> tuple[nn.Module, nn.Module, dict[str, nn.Parameter]]:
    """(PeftModel, its prompt encoder on `device`, the encoder's parameters keyed by wire name) of a method
    around the backbone."""
    # PEFT initialises the encoder's layers from torch's global RNG: seed it so a seed means one prompt.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, encoder = wrap(backbone, cfg)
    encoder.to(device)
    params = dict(encoder.named_parameters())
    return model, encoder, {wire_name: params[name] for wire_name, name in peft_state_names(cfg).items()}
