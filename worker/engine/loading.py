"""Where an engine's PLM comes from: a hub id or local path, a built transformers model, or a spec."""

from __future__ import annotations

from typing import Any, Literal

from fedprompt.shared.spec import FederationSpec
from fedprompt.worker.engine.model import (
    Backbone,
    describe_model,
    detect_family,
    encoder_only,
    language_model,
    load_backbone,
    split_masked_lm,
)
from fedprompt.worker.engine.offline import resolve_model
from torch import nn

HeadChoice = Literal["auto", "mlm", "tied-embeddings"]
# RoBERTa-style models number positions from padding_idx + 1.
_PADDING_OFFSET_MODELS = frozenset({"roberta", "xlm-roberta", "camembert", "longformer"})


def load_pretrained(model: str) -> tuple[Backbone, Any, dict[str, Any]]:
    """(backbone, tokenizer, description) of a PLM by hub id or local path ('all-MiniLM-L6-v2' → the
    offline package)."""
    from transformers import AutoTokenizer

    path = resolve_model(model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    backbone = load_backbone(path)
    return backbone, tokenizer, describe_model(path)


def backbone_of(model: nn.Module, head: HeadChoice = "auto") -> Backbone:
    """The backbone of a built transformers model: a *ForMaskedLM or bare encoder, a causal LM, or a
    seq2seq LM. 'tied-embeddings' reads a masked LM's label words through its input embeddings."""
    if detect_family(model.config, model) != "masked_lm":
        return language_model(model)
    if head == "mlm" and model.get_output_embeddings() is None:
        raise ValueError(f"{type(model).__name__} has no MLM head; use head='auto' or 'tied-embeddings'")
    if model.get_output_embeddings() is None or head == "tied-embeddings":
        return encoder_only(model.base_model if head == "tied-embeddings" else model)
    return split_masked_lm(model)


def spec_options(spec: FederationSpec) -> dict[str, Any]:
    """PromptEngine.load's keywords for a federation's spec: its template, verbalizer and prompt method."""
    return {
        "template": spec.template,
        "verbalizer": spec.verbalizer,
        "num_virtual_tokens": spec.num_virtual_tokens,
        "max_length": spec.max_length,
        "seed": spec.seed,
        "method": spec.method,
        "encoder_type": spec.encoder_type,
        "encoder_hidden_size": spec.encoder_hidden_size,
        "encoder_num_layers": spec.encoder_num_layers,
        "prefix_projection": spec.prefix_projection,
        "scoring": spec.scoring,
        "precision": spec.precision,
    }


def check_positions(config: Any, num_virtual_tokens: int, max_length: int) -> None:
    """Refuse a prompt plus input longer than the model's position embeddings."""
    limit = getattr(config, "max_position_embeddings", None)
    if limit is None:
        return
    if getattr(config, "model_type", "") in _PADDING_OFFSET_MODELS:
        limit -= (config.pad_token_id or 0) + 1
    if num_virtual_tokens + max_length > limit:
        raise ValueError(
            f"num_virtual_tokens ({num_virtual_tokens}) + max_length ({max_length}) exceeds the "
            f"model's {limit} positions"
        )
