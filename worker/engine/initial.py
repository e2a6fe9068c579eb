"""The prompt's starting values: a seeded Gaussian, sampled vocabulary embeddings or the label words."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from fedprompt.shared.methods import MethodConfig, tensor_shapes
from fedprompt.worker.engine.prompt_io import checked, write
from fedprompt.worker.engine.template import Verbalizer
from torch import nn

Init = Literal["random", "vocab", "label"]

# Lester et al. draw the initial prompt from the 5,000 most common tokens; BERT-style vocabularies are
# roughly ordered by frequency, so the first word-like ids approximate that.
VOCAB_INIT_POOL = 5000


def interleave(groups: Sequence[Sequence[int]]) -> list[int]:
    """[[a1, a2], [b1]] → [a1, b1, a2]: one word of each label in turn."""
    out: list[int] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def vocab_pool(tokenizer: Any) -> np.ndarray:
    """The first VOCAB_INIT_POOL word-like, non-special token ids of the vocabulary."""
    special = set(tokenizer.all_special_ids)
    pool: list[int] = []
    for token, idx in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        word = token.lstrip("Ġ▁")
        if idx not in special and len(word) >= 2 and word.isalpha() and word.isascii():
            pool.append(idx)
            if len(pool) >= VOCAB_INIT_POOL:
                break
    if not pool:
        raise ValueError("the vocabulary has no word-like tokens to initialise the prompt from")
    return np.asarray(pool)


def word_prompt(
    init: Literal["vocab", "label"],
    seed: int,
    num_virtual_tokens: int,
    *,
    embeddings: torch.Tensor,
    tokenizer: Any,
    verbalizer: Verbalizer,
) -> torch.Tensor:
    """[num_virtual_tokens, hidden] rows of the input embeddings: sampled vocabulary words ('vocab'),
    led by the class label words ('label')."""
    pool = vocab_pool(tokenizer)
    rng = np.random.default_rng([seed, 0xF1])
    ids = rng.choice(pool, size=num_virtual_tokens, replace=len(pool) < num_virtual_tokens)
    if init == "label":
        # Lester et al. (2021): the first virtual tokens start as the class label words, in label
        # order (the words of each label interleaved), the rest as sampled vocabulary.
        groups = [
            [w for w, lab in zip(verbalizer.word_ids, verbalizer.word_label, strict=True) if lab == label]
            for label in range(verbalizer.num_labels)
        ]
        words = interleave(groups)[:num_virtual_tokens]
        ids[: len(words)] = words
    return embeddings[torch.as_tensor(ids, dtype=torch.long)].float().cpu().clone()


def initialise(
    params: Mapping[str, nn.Parameter],
    prompt: nn.Parameter,
    config: MethodConfig,
    *,
    init: Init,
    init_std: float,
    seed: int,
    embeddings: torch.Tensor,
    tokenizer: Any,
    verbalizer: Verbalizer,
) -> None:
    """Set the method's starting values. 'random': every tensor a seeded Gaussian; 'vocab' and 'label':
    the prompt from word embeddings (a Gaussian when its rows are not word embeddings), the rest as PEFT
    initialised it."""
    # The same stream as shared.spec.initial_prompt, so a seed means the same prompt everywhere.
    rng = np.random.default_rng([seed, 0xF0])
    if init == "random":
        shapes = tensor_shapes(config)
        values = {
            n: (rng.standard_normal(shape) * init_std).astype(np.float32) for n, shape in shapes.items()
        }
        write(params, checked(values, shapes, "the random initial prompt"))
        return
    if init not in ("vocab", "label"):
        raise ValueError(f"init must be 'random', 'vocab' or 'label'; got {init!r}")
    if tuple(prompt.shape) != (config.num_virtual_tokens, config.hidden_size):
        # Un-projected prefixes are keys and values, not word embeddings: seeded Gaussian instead.
        value = torch.from_numpy((rng.standard_normal(tuple(prompt.shape)) * init_std).astype(np.float32))
    else:
        value = word_prompt(
            init,
            seed,
            config.num_virtual_tokens,
            embeddings=embeddings,
            tokenizer=tokenizer,
            verbalizer=verbalizer,
        )
    with torch.no_grad():
        prompt.copy_(value.to(prompt.device))
