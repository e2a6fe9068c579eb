"""How label scores are read: the label words through the model's head, or, for an encoder whose
checkpoint has no MLM head, mean-pool similarity with the label phrases."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from fedprompt.shared.vocab import Scoring
from fedprompt.worker.engine.families import ScoreReading, adapter
from fedprompt.worker.engine.model import Backbone
from fedprompt.worker.engine.template import Template, Verbalizer
from torch.nn import functional as F

# Cosine similarities × this scale are the label logits of mean-pool scoring (sentence-transformers'
# contrastive losses use the same scale).
SIMILARITY_SCALE = 20.0


def resolve_scoring(scoring: Scoring | str, backbone: Backbone) -> ScoreReading:
    """How label scores are read. 'auto': the label words through the model's LM / MLM head when it has
    one, mean-pool similarity for an encoder whose checkpoint has none (e.g. all-MiniLM-L6-v2);
    'tied-embeddings': the label words at [MASK] through the tied input embeddings even then; the
    backbone's family decides (worker/engine/families/)."""
    try:
        choice = Scoring(scoring)
    except ValueError:
        names = [str(s) for s in Scoring]
        raise ValueError(f"scoring must be {', '.join(names[:-1])} or {names[-1]}; got {scoring!r}") from None
    return adapter(backbone.family).resolve_scoring(choice, backbone)


def _flatten(groups: Sequence[Sequence[str]]) -> list[str]:
    return [word for group in groups for word in group]


def pooled_scores(hidden: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean-pool scoring: SIMILARITY_SCALE × cosine of the mean-pooled output of the real tokens (the
    prompt acts through attention; its own positions are left out, as the model was trained to pool)
    with each label's phrase embedding (`labels`: [num_labels, hidden], normalised)."""
    virtual = hidden.shape[1] - attention_mask.shape[1]  # prompt tuning and P-tuning prepend these
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
    pooled = (hidden[:, virtual:] * mask).sum(dim=1) / mask.sum(dim=1)
    return SIMILARITY_SCALE * F.normalize(pooled.float(), dim=-1) @ labels.T


def word_average(verbalizer: Verbalizer) -> torch.Tensor:
    """[num_labels, num_words]: label scores are word_logits @ this.T, the mean over each label's words as
    one matmul."""
    average = torch.zeros(verbalizer.num_labels, len(verbalizer.word_ids))
    for j, label in enumerate(verbalizer.word_label):
        average[label, j] = 1.0
    return average / average.sum(dim=1, keepdim=True)


@torch.no_grad()
def phrase_embeddings(
    encoder: Any, tokenizer: Any, template: Template, verbalizer: Verbalizer, device: torch.device
) -> torch.Tensor:
    """[num_labels, hidden]: each label's phrases (the template without its text, [MASK] replaced by a
    label word: "It was great.") through the frozen encoder without a prompt, mean-pooled and
    normalised; a label with several words averages them."""
    phrases = [template.label_phrase(word) for word in _flatten(verbalizer.words)]
    batch = tokenizer(phrases, return_tensors="pt", padding=True).to(device)
    hidden = encoder(**batch).last_hidden_state.float()
    mask = batch["attention_mask"].unsqueeze(-1).float()
    each = F.normalize((hidden * mask).sum(dim=1) / mask.sum(dim=1), dim=-1)
    labels = torch.tensor(verbalizer.word_label, device=device)
    per_label = torch.stack([each[labels == k].mean(dim=0) for k in range(verbalizer.num_labels)])
    return F.normalize(per_label, dim=-1)
