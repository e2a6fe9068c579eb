"""Where an engine's PLM comes from: a hub id or local path, a built transformers model, or a spec."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedprompt.shared.spec import FederationSpec
from fedprompt.worker.engine.families import adapter, detect
from fedprompt.worker.engine.model import Backbone, HeadChoice, describe_model
from fedprompt.worker.engine.offline import resolve_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel

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


def load_backbone(path: str) -> Backbone:
    """Load a PLM of any registered family (its family read from its config): a masked LM, scored with
    its tied input embeddings when the checkpoint lacks the MLM head weights; a causal or seq2seq LM."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    return adapter(detect(config)).load(path, config)


def backbone_of(model: PreTrainedModel, head: HeadChoice = "auto") -> Backbone:
    """The backbone of a built transformers model: a *ForMaskedLM or bare encoder, a causal LM, or a
    seq2seq LM. 'tied-embeddings' reads a masked LM's label words through its input embeddings."""
    return adapter(detect(model.config, model)).backbone_of(model, head)


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
