"""Prompt methods as data: the communicated tensors of each method and their PEFT adapter form.

numpy only (the coordinator validates, averages and exports with it and never imports torch). The tensor
names are the parameter names of HF PEFT's prompt encoders, so a worker loads them into PEFT with
``strict=True`` and the export below is what ``PeftModel.save_pretrained`` would write:

- ``prompt_tuning``: ``prompt_embeddings`` [n, hidden] (PEFT ``PromptEmbedding.embedding.weight``).
- ``p_tuning``: the prompt encoder itself, ``prompt_encoder.embedding.weight`` plus its MLP or LSTM
  (PEFT ``PromptEncoder``); FedPrompt communicates the encoder, not its output.
- ``prefix_tuning``: ``prompt_embeddings`` [n, 2 * layers * kv_size], the key/value prefixes of every layer
  (kv_size = hidden, or num_key_value_heads × head_dim under grouped-query attention)
  (PEFT ``PrefixEncoder.embedding.weight``); with ``prefix_projection`` the re-parameterisation
  (``prompt_encoder.embedding.weight`` and ``prompt_encoder.transform.*``) is communicated instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from fedprompt.shared.vocab import PEFT_TASK_TYPES, EncoderType, Family, Method

METHODS: tuple[Method, ...] = tuple(Method)
FAMILIES: tuple[Family, ...] = tuple(Family)

PROMPT_TENSOR = "prompt_embeddings"
ENCODER_PREFIX = "prompt_encoder."

# PEFT's names for the methods and for the way a model family is wrapped. The task type is the one fact
# of a family the coordinator needs (to export an adapter) and cannot read from the worker's family
# adapter (worker/engine/families/, torch): a family's adapter reads its own entry here.
PEFT_TYPES: dict[Method, str] = {
    Method.PROMPT_TUNING: "PROMPT_TUNING",
    Method.P_TUNING: "P_TUNING",
    Method.PREFIX_TUNING: "PREFIX_TUNING",
}


class MethodError(ValueError):
    """A method configuration that cannot work (e.g. prefix tuning without the number of layers)."""


@dataclass(frozen=True)
class MethodConfig:
    """Everything that fixes the names and shapes of a method's communicated tensors."""

    method: Method = Method.PROMPT_TUNING
    num_virtual_tokens: int = 20
    hidden_size: int = 384
    num_layers: int | None = None
    # width of one layer's key (or value) states: hidden_size under multi-head attention,
    # num_key_value_heads × head_dim under grouped-query attention (Llama, SmolLM2); None: hidden_size
    kv_size: int | None = None
    encoder_type: EncoderType = EncoderType.MLP
    encoder_hidden_size: int | None = None
    encoder_num_layers: int = 2
    prefix_projection: bool = False

    @property
    def encoder_hidden(self) -> int:
        """Hidden size of the re-parameterisation (default: the model's hidden size, as in PEFT's examples)."""
        return self.encoder_hidden_size or self.hidden_size

    @property
    def communicates_encoder(self) -> bool:
        """Whether the wire carries an encoder (P-tuning, projected prefixes) rather than the prompt itself."""
        return self.method == Method.P_TUNING or (
            self.method == Method.PREFIX_TUNING and self.prefix_projection
        )

    def prompt_width(self) -> int:
        """Width of one materialised virtual token: hidden, or 2 * layers * kv_size for prefixes (a key and
        a value state per layer)."""
        if self.method == Method.PREFIX_TUNING:
            if not self.num_layers:
                raise MethodError("prefix tuning needs num_layers (the model's number of transformer layers)")
            return 2 * self.num_layers * (self.kv_size or self.hidden_size)
        return self.hidden_size


def tensor_shapes(cfg: MethodConfig) -> dict[str, tuple[int, ...]]:
    """Wire names and shapes of the tensors a method communicates (PEFT parameter names)."""
    n, h, e = cfg.num_virtual_tokens, cfg.hidden_size, cfg.encoder_hidden
    if cfg.method == Method.PROMPT_TUNING:
        return {PROMPT_TENSOR: (n, h)}
    if cfg.method == Method.PREFIX_TUNING:
        width = cfg.prompt_width()
        if not cfg.prefix_projection:
            return {PROMPT_TENSOR: (n, width)}
        k = cfg.kv_size or h  # PEFT sizes the prefix encoder's input by the key/value width too
        return _prefixed(
            {
                "embedding.weight": (n, k),
                "transform.0.weight": (e, k),
                "transform.0.bias": (e,),
                "transform.2.weight": (width, e),
                "transform.2.bias": (width,),
            }
        )
    if cfg.method != Method.P_TUNING:
        raise MethodError(f"unknown method {cfg.method!r}; choose one of {', '.join(METHODS)}")
    shapes: dict[str, tuple[int, ...]] = {"embedding.weight": (n, h)}
    if cfg.encoder_type == EncoderType.MLP:
        shapes.update(
            {
                "mlp_head.0.weight": (e, h),
                "mlp_head.0.bias": (e,),
                "mlp_head.2.weight": (e, e),
                "mlp_head.2.bias": (e,),
                "mlp_head.4.weight": (h, e),
                "mlp_head.4.bias": (h,),
            }
        )
    elif cfg.encoder_type == EncoderType.LSTM:
        for layer in range(cfg.encoder_num_layers):
            width_in = h if layer == 0 else 2 * e
            for suffix in (f"l{layer}", f"l{layer}_reverse"):
                shapes[f"lstm_head.weight_ih_{suffix}"] = (4 * e, width_in)
                shapes[f"lstm_head.weight_hh_{suffix}"] = (4 * e, e)
                shapes[f"lstm_head.bias_ih_{suffix}"] = (4 * e,)
                shapes[f"lstm_head.bias_hh_{suffix}"] = (4 * e,)
        shapes.update(
            {
                "mlp_head.0.weight": (2 * e, 2 * e),
                "mlp_head.0.bias": (2 * e,),
                "mlp_head.2.weight": (h, 2 * e),
                "mlp_head.2.bias": (h,),
            }
        )
    else:
        raise MethodError(f"encoder_type must be 'mlp' or 'lstm'; got {cfg.encoder_type!r}")
    return _prefixed(shapes)


def _prefixed(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    return {ENCODER_PREFIX + name: shape for name, shape in shapes.items()}


def num_parameters(cfg: MethodConfig) -> int:
    """Parameters communicated per transfer (one direction, one client)."""
    return sum(math.prod(shape) for shape in tensor_shapes(cfg).values())


def peft_state_names(cfg: MethodConfig) -> dict[str, str]:
    """Wire name → parameter name inside PEFT's prompt encoder module."""
    return {
        name: (name[len(ENCODER_PREFIX) :] if name.startswith(ENCODER_PREFIX) else "embedding.weight")
        for name in tensor_shapes(cfg)
    }


# ---------------------------------------------------------------------- materialising the prompt (numpy)


def _sigmoid(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return 1.0 / (1.0 + np.exp(-x))


def _lstm_direction(x: np.ndarray, w_ih: np.ndarray, w_hh: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One direction of torch.nn.LSTM over a single sequence x [T, in] → [T, hidden] (gates i, f, g, o)."""
    hidden = w_hh.shape[1]
    h = np.zeros(hidden)
    c = np.zeros(hidden)
    out = np.zeros((x.shape[0], hidden))
    for t in range(x.shape[0]):
        gates = w_ih @ x[t] + w_hh @ h + b
        i, f, g, o = np.split(gates, 4)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        out[t] = h
    return out


def materialise(cfg: MethodConfig, tensors: Mapping[str, np.ndarray]) -> np.ndarray:
    """The virtual tokens the model sees, [n, width], computed from the communicated tensors (float64 math)."""
    if not cfg.communicates_encoder:
        return np.asarray(tensors[PROMPT_TENSOR], dtype=np.float32)
    t = {name[len(ENCODER_PREFIX) :]: np.asarray(v, dtype=np.float64) for name, v in tensors.items()}
    x = t["embedding.weight"]

    def linear(a: np.ndarray, name: str) -> np.ndarray:
        return a @ t[f"{name}.weight"].T + t[f"{name}.bias"]

    if cfg.method == Method.PREFIX_TUNING:
        out = linear(np.tanh(linear(x, "transform.0")), "transform.2")
    elif cfg.encoder_type == EncoderType.MLP:
        hidden = np.maximum(linear(x, "mlp_head.0"), 0.0)
        hidden = np.maximum(linear(hidden, "mlp_head.2"), 0.0)
        out = linear(hidden, "mlp_head.4")
    else:
        seq = x
        for layer in range(cfg.encoder_num_layers):
            parts = []
            for suffix, reverse in ((f"l{layer}", False), (f"l{layer}_reverse", True)):
                inp = seq[::-1] if reverse else seq
                bias = t[f"lstm_head.bias_ih_{suffix}"] + t[f"lstm_head.bias_hh_{suffix}"]
                res = _lstm_direction(
                    inp, t[f"lstm_head.weight_ih_{suffix}"], t[f"lstm_head.weight_hh_{suffix}"], bias
                )
                parts.append(res[::-1] if reverse else res)
            seq = np.concatenate(parts, axis=1)
        out = linear(np.maximum(linear(seq, "mlp_head.0"), 0.0), "mlp_head.2")
    return out.astype(np.float32)


def peft_fields(cfg: MethodConfig, *, task_type: str, num_attention_heads: int | None) -> dict[str, Any]:
    """The fields of PEFT's config of a method (``peft_type`` included), as the engine trains it: what the
    worker builds its PEFT config from and what the exported adapter_config.json states."""
    if cfg.method not in PEFT_TYPES:
        raise MethodError(f"unknown method {cfg.method!r}")
    fields: dict[str, Any] = {
        "peft_type": PEFT_TYPES[cfg.method],
        "task_type": task_type,
        "num_virtual_tokens": cfg.num_virtual_tokens,
        "token_dim": cfg.hidden_size,
        # Virtual tokens on the encoder input only; seq2seq prefixes in the decoder's self- and
        # cross-attention (PEFT's default for them; the encoder takes no cache).
        "num_transformer_submodules": 2
        if (task_type == PEFT_TASK_TYPES[Family.SEQ2SEQ] and cfg.method == Method.PREFIX_TUNING)
        else 1,
        "num_attention_heads": num_attention_heads,
        "num_layers": cfg.num_layers,
    }
    if cfg.method == Method.P_TUNING:
        fields.update(
            {
                "encoder_reparameterization_type": cfg.encoder_type.upper(),
                "encoder_hidden_size": cfg.encoder_hidden,
                "encoder_num_layers": cfg.encoder_num_layers,
                "encoder_dropout": 0.0,
            }
        )
    elif cfg.method == Method.PREFIX_TUNING:
        fields.update({"encoder_hidden_size": cfg.encoder_hidden, "prefix_projection": cfg.prefix_projection})
    return fields


def peft_adapter_config(
    cfg: MethodConfig,
    *,
    family: Family | str,
    base_model: str,
    num_attention_heads: int | None,
) -> dict[str, Any]:
    """adapter_config.json of the exported adapter (PEFT's fields for the method, inference mode)."""
    if cfg.method == Method.PREFIX_TUNING and not num_attention_heads:
        raise MethodError("exporting prefix tuning needs num_attention_heads (the model's attention heads)")
    config: dict[str, Any] = {
        **peft_fields(cfg, task_type=PEFT_TASK_TYPES[family], num_attention_heads=num_attention_heads),
        "base_model_name_or_path": base_model,
        "revision": None,
        "inference_mode": True,
        "modules_to_save": None,
    }
    if cfg.method == Method.PROMPT_TUNING:  # PEFT's defaults, which the engine trains with, stated
        config.update(
            {
                "prompt_tuning_init": "RANDOM",
                "prompt_tuning_init_text": None,
                "tokenizer_name_or_path": None,
                "tokenizer_kwargs": None,
            }
        )
    return config
