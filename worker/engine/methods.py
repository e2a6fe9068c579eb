"""The prompt methods on the worker: HF PEFT's prompt encoders around the frozen PLM.

PEFT builds the trainable module (PromptEmbedding, PromptEncoder with an MLP or LSTM, PrefixEncoder) and
runs the forward pass (virtual tokens prepended to the input embeddings, or key/value prefixes handed to
every attention layer as a cache). The engine reads the label words from what PEFT returns. The wire
names of shared.methods map one to one onto the prompt encoder's parameters; the PEFT config is the
family adapter's (worker/engine/families/), from shared.methods.peft_fields.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from fedprompt.shared.methods import MethodConfig, MethodError, peft_state_names
from fedprompt.worker.engine.model import Backbone
from torch import nn


def model_shape(config: Any) -> tuple[int, int, int]:
    """(hidden size, layers, attention heads) of a transformers config, as PEFT reads them."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = getattr(text, "hidden_size", 0) or getattr(text, "n_embd", 0) or getattr(text, "d_model", 0)
    layers = (
        getattr(text, "num_hidden_layers", 0) or getattr(text, "num_layers", 0) or getattr(text, "n_layer", 0)
    )
    heads = (
        getattr(text, "num_attention_heads", 0) or getattr(text, "n_head", 0) or getattr(text, "num_heads", 0)
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


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # PEFT warns that FEATURE_EXTRACTION models and frozen bases are unusual; both are intended here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def wrap(backbone: Backbone, cfg: MethodConfig) -> tuple[nn.Module, nn.Module]:
    """(PeftModel around the backbone's runner, its prompt encoder) for a method."""
    from fedprompt.worker.engine.families import adapter
    from peft import get_peft_model

    with _quiet():
        config = adapter(backbone.family).peft_config(cfg, backbone.config)
        model = get_peft_model(backbone.runner, config)
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
