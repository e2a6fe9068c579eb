"""Masked LMs (BERT, RoBERTa, MiniLM, DistilBERT): the label words at [MASK], through the MLM head, the
tied input embeddings when the checkpoint has no head, or mean-pool similarity on a bare encoder."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from fedprompt.shared.methods import MethodConfig, MethodError
from fedprompt.shared.vocab import Family, Method, Scoring
from fedprompt.worker.engine.families.base import FamilyAdapter, ScoreReading, register
from fedprompt.worker.engine.model import (
    Backbone,
    HeadChoice,
    ModelError,
    input_embeddings_of,
    quiet_transformers,
)
from fedprompt.worker.engine.template import TemplateError
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Encoders whose attention layers accept no past key/values (checked: DistilBERT).
_NO_PREFIX_SUPPORT = frozenset({"distilbert"})


def _head_module(model: nn.Module) -> nn.Module | None:
    """The single non-encoder child of a *ForMaskedLM model (BERT: cls, RoBERTa: lm_head), if there is one."""
    base_prefix = getattr(model, "base_model_prefix", "")
    others = [
        module
        for name, module in model.named_children()
        if name != base_prefix and any(True for _ in module.parameters())
    ]
    return others[0] if len(others) == 1 else None


def split_masked_lm(model: PreTrainedModel, missing_keys: set[str] | list[str] | None = None) -> Backbone:
    """Split a *ForMaskedLM model into encoder + head; fall back to tied embeddings when the head was not loaded."""
    base_prefix = getattr(model, "base_model_prefix", "")
    # Tied copies (e.g. the decoder weight = the input embeddings) may be reported missing but are fine.
    tied = getattr(model, "_tied_weights_keys", None) or {}
    missing = set(missing_keys or ()) - set(tied)
    # Keys outside the encoder that were not in the checkpoint mean the head is randomly initialised.
    head_missing = any(not key.startswith(f"{base_prefix}.") for key in missing)
    encoder = model.base_model if base_prefix and hasattr(model, base_prefix) else model
    input_embeddings = input_embeddings_of(model)
    if head_missing:
        return Backbone(
            encoder, "tied-embeddings", None, None, input_embeddings, model.config, Family.MASKED_LM
        )
    head = _head_module(model)
    return Backbone(
        encoder,
        "mlm",
        head,
        None if head is not None else model,
        input_embeddings,
        model.config,
        Family.MASKED_LM,
    )


def encoder_only(model: PreTrainedModel) -> Backbone:
    """Use a bare encoder (e.g. BertModel) with label words read through its tied input embeddings."""
    return Backbone(
        model, "tied-embeddings", None, None, input_embeddings_of(model), model.config, Family.MASKED_LM
    )


@register
class MaskedLMAdapter(FamilyAdapter):
    """*ForMaskedLM models and bare encoders: what no other family claims."""

    name = Family.MASKED_LM
    detect_rank = 100  # the fallback

    def claims(self, config: Any, model: nn.Module | None = None) -> bool:
        return True

    def load(self, path: str, config: Any) -> Backbone:
        """The masked LM; if its checkpoint lacks the MLM head weights, scored with the tied input embeddings."""
        from transformers import AutoModelForMaskedLM

        with quiet_transformers():
            try:
                model, info = AutoModelForMaskedLM.from_pretrained(path, output_loading_info=True)
            except ValueError as exc:
                raise ModelError(
                    f"{path!r} ({config.model_type}) has no masked-LM architecture in transformers; prompt "
                    f"tuning with a [MASK] verbalizer needs a masked LM such as BERT, RoBERTa or MiniLM ({exc})"
                ) from None
        return split_masked_lm(model, info.get("missing_keys"))

    def backbone_of(self, model: PreTrainedModel, head: HeadChoice = "auto") -> Backbone:
        """'tied-embeddings' reads the label words through the input embeddings even when there is a head."""
        if head == "mlm" and model.get_output_embeddings() is None:
            raise ValueError(f"{type(model).__name__} has no MLM head; use head='auto' or 'tied-embeddings'")
        if model.get_output_embeddings() is None or head == "tied-embeddings":
            # base_model: the PreTrainedModel under base_model_prefix (BertModel in BertForMaskedLM), or the
            # model itself; transformers annotates it as any Module
            base = cast("PreTrainedModel", model.base_model) if head == "tied-embeddings" else model
            return encoder_only(base)
        return split_masked_lm(model)

    def mask_id(self, tokenizer: Any) -> int | None:
        if tokenizer.mask_token_id is None:
            raise TemplateError("the tokenizer has no mask token; a [MASK] template needs a masked LM")
        return int(tokenizer.mask_token_id)

    def resolve_scoring(self, scoring: Scoring, backbone: Backbone) -> ScoreReading:
        """'auto': mean-pool similarity for an encoder whose checkpoint has no MLM head (e.g.
        all-MiniLM-L6-v2), else the label words at [MASK]; 'tied-embeddings': the label words through the
        tied input embeddings even then; 'mean-pool' on any encoder."""
        bare_encoder = backbone.full_model is None
        if scoring == Scoring.MEAN_POOL and not bare_encoder:
            raise ValueError("mean-pool scoring needs an encoder (a masked LM such as BERT or MiniLM)")
        if scoring == Scoring.MEAN_POOL or (
            scoring == Scoring.AUTO and bare_encoder and backbone.mlm_head is None
        ):
            return "mean-pool"
        return "label-words"

    def word_logits(
        self, backbone: Backbone, out: Any, rows: torch.Tensor, at: torch.Tensor, word_ids: torch.Tensor
    ) -> torch.Tensor:
        if backbone.full_model is not None:  # no separable head (DistilBERT): the model's own logits
            return out.logits[rows, at][:, word_ids]
        hidden = out.last_hidden_state[rows, at]
        if backbone.mlm_head is not None:
            return backbone.mlm_head(hidden)[:, word_ids]
        # No trained MLM head in the checkpoint: read the label words through the tied input embeddings.
        return hidden @ backbone.input_embeddings.weight[word_ids].T

    def check_method(self, cfg: MethodConfig, config: Any) -> None:
        if cfg.method == Method.PREFIX_TUNING and getattr(config, "model_type", "") in _NO_PREFIX_SUPPORT:
            raise MethodError(
                f"{config.model_type} attention takes no key/value cache, so prefix tuning cannot reach it"
            )
