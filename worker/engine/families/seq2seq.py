"""Encoder-decoder LMs (T5, BART): the template through the encoder, the label word read at the decoder's
first position."""

from __future__ import annotations

from typing import Any

import torch
from fedprompt.shared.vocab import Family
from fedprompt.worker.engine.families.base import LanguageModelAdapter, register
from fedprompt.worker.engine.model import Backbone
from fedprompt.worker.engine.template import TemplateError
from torch import nn


def decoder_start_id(config: Any) -> int:
    """The token a seq2seq decoder starts from: decoder_start_token_id, else the pad token, else 0."""
    start = getattr(config, "decoder_start_token_id", None)
    return int(start if start is not None else (config.pad_token_id or 0))


@register
class Seq2SeqAdapter(LanguageModelAdapter):
    """Models whose config says is_encoder_decoder, run whole."""

    name = Family.SEQ2SEQ
    detect_rank = 0

    def claims(self, config: Any, model: nn.Module | None = None) -> bool:
        return bool(getattr(config, "is_encoder_decoder", False))

    def auto_class(self) -> Any:
        from transformers import AutoModelForSeq2SeqLM

        return AutoModelForSeq2SeqLM

    def mask_id(self, tokenizer: Any) -> int | None:
        """The mask token, else T5's first sentinel."""
        if tokenizer.mask_token_id is not None:
            return int(tokenizer.mask_token_id)
        sentinel = tokenizer.convert_tokens_to_ids("<extra_id_0>")
        if sentinel is not None and sentinel != tokenizer.unk_token_id:
            return int(sentinel)
        raise TemplateError(
            "the tokenizer has neither a mask token nor T5's <extra_id_0> sentinel for [MASK]"
        )

    def model_inputs(self, backbone: Backbone, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        start = decoder_start_id(backbone.config)
        return {
            "decoder_input_ids": torch.full(
                (input_ids.shape[0], 1), start, dtype=torch.long, device=input_ids.device
            )
        }

    def word_logits(
        self, backbone: Backbone, out: Any, rows: torch.Tensor, at: torch.Tensor, word_ids: torch.Tensor
    ) -> torch.Tensor:
        return out.logits[:, 0][:, word_ids]  # the first decoder token reads the label word
