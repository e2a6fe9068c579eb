"""The prompt's tensors in and out: float32 copies, validated replacement and the wire form's metadata."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from fedprompt.shared import wire
from torch import nn


class PromptError(ValueError):
    """A prompt whose tensor names, shapes or values do not fit this engine."""


def read(params: Mapping[str, nn.Parameter]) -> dict[str, np.ndarray]:
    """A float32 copy of the tensors, keyed by their wire names."""
    return {name: p.detach().float().cpu().numpy().copy() for name, p in params.items()}


def checked(
    tensors: Mapping[str, np.ndarray | torch.Tensor], expected: Mapping[str, tuple[int, ...]], context: str
) -> dict[str, torch.Tensor]:
    """The tensors as float32 CPU tensors when their names and shapes are exactly `expected` and their values
    finite; PromptError otherwise (`context` describes the engine in the shape message)."""
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise PromptError(
            f"prompt tensors do not match this engine: missing {missing}, unexpected {extra}; "
            f"expected exactly {sorted(expected)}"
        )
    values: dict[str, torch.Tensor] = {}
    for name, shape in expected.items():
        value = tensors[name]
        array = (
            value.detach().cpu() if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))
        )
        if tuple(array.shape) != shape:
            raise PromptError(
                f"prompt tensor '{name}' has shape {list(array.shape)}; expected {list(shape)} ({context})"
            )
        if not array.is_floating_point():
            raise PromptError(f"prompt tensor '{name}' has dtype {array.dtype}; expected float32")
        array = array.to(torch.float32)
        if not bool(torch.isfinite(array).all()):
            raise PromptError(f"prompt tensor '{name}' contains NaN or Inf values")
        values[name] = array
    return values


def write(params: Mapping[str, nn.Parameter], values: Mapping[str, torch.Tensor]) -> None:
    """Copy checked values into the parameters of the same names."""
    with torch.no_grad():
        for name, value in values.items():
            params[name].copy_(value.to(params[name].device))


def decode(data: bytes, fingerprint: str | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors, metadata) of safetensors bytes; with a fingerprint, PromptError when the metadata names
    another model."""
    tensors, meta = wire.decode(data)
    if fingerprint is not None and meta.get("model_fingerprint", fingerprint) != fingerprint:
        raise PromptError(
            f"prompt was made for model {meta['model_fingerprint']}; this engine's model is {fingerprint}"
        )
    return tensors, meta
