"""Causal LMs (GPT-2, Llama, SmolLM2): the label word is the next token after the text before [MASK]."""

from __future__ import annotations

from typing import Any

import torch
from fedprompt.shared.vocab import Family
from fedprompt.worker.engine.families.base import LanguageModelAdapter, register
from fedprompt.worker.engine.model import Backbone
from fedprompt.worker.engine.template import MASK_SLOT
from torch import nn


@register
class CausalLMAdapter(LanguageModelAdapter):
    """*ForCausalLM / *LMHeadModel models, run whole; the logits after the template's text read the label."""

    name = Family.CAUSAL_LM
    detect_rank = 10

    def claims(self, config: Any, model: nn.Module | None = None) -> bool:
        names = (
            [type(model).__name__]
            if model is not None
            else list(getattr(config, "architectures", None) or [])
        )
        return any(name.endswith(("ForCausalLM", "LMHeadModel")) for name in names)

    def auto_class(self) -> Any:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM

    def mask_id(self, tokenizer: Any) -> int | None:
        return None  # nothing stands for [MASK]: the model predicts the label word as the next token

    def template_text(self, template: str) -> str:
        # The label word is the next token after the text before [MASK]; what follows [MASK] is never read.
        return template[: template.index(MASK_SLOT) + len(MASK_SLOT)]

    def assemble(
        self, prefix: list[int], body: list[int], suffix: list[int], mask_at: int
    ) -> tuple[list[int], int]:
        # The logits at the last token before [MASK] predict the label word; no end tokens.
        return prefix + body, len(prefix) + mask_at - 1

    def word_logits(
        self, backbone: Backbone, out: Any, rows: torch.Tensor, at: torch.Tensor, word_ids: torch.Tensor
    ) -> torch.Tensor:
        return out.logits[rows, at][:, word_ids]
