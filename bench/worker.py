"""Worker overhead: steps/s of the engine's local training vs a bare torch loop, same model, batches and data.

    python -m bench.worker [--steps 10 --blocks 4 --batch-size 16 --max-length 64]

The bare loop is what one would write by hand: tokenise the batch with the template text, prepend a
soft prompt (nn.Parameter) to the word embeddings of a frozen all-MiniLM-L6-v2, read the label words
at [MASK] through the tied input embeddings, cross-entropy, AdamW on the prompt, gradient clipping.
Both see the same SST-2 examples in the same batches (the engine's seeded batch order, with its
length grouping off: `length_window=1`), with the same torch threads. A third arm is the engine as it
trains by default, batching examples of similar length together: its ratio to the first is what
length grouping saves. The three run back to back in each block, in a rotating order, and each
ratio is the median over blocks of the paired ratios, so a burst of load from other jobs hits all. The share of a round spent outside training is measured
end to end by ``bench.e2e``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fedprompt.shared.spec import DEFAULT_MODEL
from fedprompt.worker.data import load_dataset, preset_for
from fedprompt.worker.engine import PromptEngine
from fedprompt.worker.engine.batching import LENGTH_WINDOW, cycle_batches
from fedprompt.worker.engine.offline import resolve_model
from torch.nn import functional as F

from bench.common import ratio, self_peak_rss_mib, write_result


class BareLoop:
    """Prompt tuning by hand with plain transformers + torch."""

    def __init__(
        self, template: str, words: list[list[str]], max_length: int, tokens: int, init: torch.Tensor
    ):
        from transformers import AutoModel, AutoTokenizer

        path = resolve_model(DEFAULT_MODEL)
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval().requires_grad_(False)
        self.template = template.replace("[MASK]", self.tok.mask_token)
        self.word_ids = torch.tensor([self.tok.convert_tokens_to_ids(w[0]) for w in words])
        self.max_length, self.tokens = max_length, tokens
        self.init = init.detach().clone()

    def train(self, examples: Any, labels: torch.Tensor, *, steps: int, batch_size: int, seed: int) -> float:
        """`steps` AdamW steps from the initial prompt; returns the last loss."""
        prompt = torch.nn.Parameter(self.init.clone())
        opt = torch.optim.AdamW([prompt], lr=0.3, weight_decay=0.0)
        batches = cycle_batches(len(examples), batch_size, np.random.default_rng([seed, 0xBA]))
        emb = self.model.embeddings.word_embeddings
        loss = torch.tensor(0.0)
        for _ in range(steps):
            idx = next(batches)
            texts = [self.template.format(text=examples[int(i)].text.strip()) for i in idx]
            enc = self.tok(
                texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
            )
            b = enc.input_ids.shape[0]
            x = torch.cat([prompt.unsqueeze(0).expand(b, -1, -1), emb(enc.input_ids)], dim=1)
            mask = torch.cat(
                [torch.ones(b, self.tokens, dtype=enc.attention_mask.dtype), enc.attention_mask], 1
            )
            hidden = self.model(inputs_embeds=x, attention_mask=mask).last_hidden_state
            at = (enc.input_ids == self.tok.mask_token_id).int().argmax(dim=1) + self.tokens
            logits = hidden[torch.arange(b), at] @ emb.weight[self.word_ids].T
            loss = F.cross_entropy(logits, labels[torch.as_tensor(idx)])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([prompt], 1.0)
            opt.step()
        return float(loss.detach())


def real_token_share(
    engine: PromptEngine, examples: Any, batch_size: int, window: int, batches: int = 64
) -> float:
    """Real tokens ÷ padded positions in the engine's first `batches` training batches."""
    order = engine._length_batches(examples, batch_size, np.random.default_rng([0, 0xBA]), window)
    real = total = 0
    for _ in range(batches):
        _, _, mask, _ = next(order)
        real, total = real + int(mask.sum()), total + mask.numel()
    return real / total


def main(argv: list[str] | None = None) -> None:
    """Alternate blocks of engine and bare-loop training; write bench/results/worker.json."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4, help="training steps per block")
    ap.add_argument("--blocks", type=int, default=8, help="pairs of blocks (after one warm-up pair)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--train-limit", type=int, default=4000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = load_dataset("sst2", "train").sample(args.train_limit, 0)
    preset = preset_for(data.name, data.task)
    assert preset is not None  # SST-2 has a preset
    engine = PromptEngine.load(
        DEFAULT_MODEL,
        template=preset.template,
        verbalizer=preset.verbalizer,
        num_virtual_tokens=20,
        max_length=args.max_length,
        seed=0,
        num_threads=args.threads,
        scoring="tied-embeddings",  # what the bare loop computes
    )
    examples = list(data)
    labels = torch.tensor([int(ex.label) for ex in examples])
    bare = BareLoop(preset.template, preset.verbalizer, args.max_length, 20, engine.prompt)
    init = engine.get_prompt()
    sides = ("engine", "bare", "grouped")
    rates: dict[str, list[float]] = {side: [] for side in sides}
    paired, grouping = [], []
    for block in range(args.blocks + 1):
        # Each block runs the three back to back; the order rotates, so a change of load within a
        # block favours none of them over the run.
        seconds = {}
        for side in sides[block % 3 :] + sides[: block % 3]:
            t0 = time.perf_counter()
            if side == "bare":
                bare.train(examples, labels, steps=args.steps, batch_size=args.batch_size, seed=block)
            else:
                engine.set_prompt(init)
                engine.train(
                    examples,
                    steps=args.steps,
                    batch_size=args.batch_size,
                    lr=0.3,
                    seed=block,
                    length_window=LENGTH_WINDOW if side == "grouped" else 1,
                )
            seconds[side] = time.perf_counter() - t0
        if block == 0:
            continue  # warm-up: first calls allocate and tune kernels
        for side in sides:
            rates[side].append(args.steps / seconds[side])
        paired.append(seconds["bare"] / seconds["engine"])
        grouping.append(seconds["engine"] / seconds["grouped"])
        print(
            f"block {block}: engine {rates['engine'][-1]:.2f} steps/s, bare loop {rates['bare'][-1]:.2f}, "
            f"engine with length grouping {rates['grouped'][-1]:.2f}; bare/engine {paired[-1]:.3f}, "
            f"grouping {grouping[-1]:.3f}x",
            flush=True,
        )
    engine_rates, bare_rates = rates["engine"], rates["bare"]
    shares = {w: real_token_share(engine, examples, args.batch_size, w) for w in (1, LENGTH_WINDOW)}
    eng, bar = statistics.median(engine_rates), statistics.median(bare_rates)
    result = {
        "model": DEFAULT_MODEL,
        "dataset": data.name,
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "steps_per_block": args.steps,
        "threads": args.threads,
        "engine_steps_per_s": eng,
        "bare_steps_per_s": bar,
        # the figure: the median over blocks of (bare seconds / engine seconds) on the same batches,
        # measured back to back; the ratio of the two medians is kept for comparison
        "ratio": statistics.median(paired),
        "paired_ratios": paired,
        "ratio_of_medians": ratio(eng, bar),
        "engine_blocks": engine_rates,
        "bare_blocks": bare_rates,
        # the engine as it trains by default (examples of similar length batched together, windows of
        # LENGTH_WINDOW batches): its speed-up over the same engine on the random batches, paired
        "length_window": LENGTH_WINDOW,
        "grouped_steps_per_s": statistics.median(rates["grouped"]),
        "grouped_blocks": rates["grouped"],
        "length_grouping_speedup": statistics.median(grouping),
        # real tokens ÷ padded positions over 64 batches of each (the prompt's virtual tokens left out)
        "real_token_share_random": shares[1],
        "real_token_share_grouped": shares[LENGTH_WINDOW],
        "paired_grouping_ratios": grouping,
        "peak_rss_mib": self_peak_rss_mib(),
    }
    path = write_result("worker", result, out_dir=Path(args.out_dir) if args.out_dir else None)
    print(
        f"engine {eng:.2f} vs bare {bar:.2f} steps/s: {result['ratio']:.3f}x; length grouping "
        f"{result['length_grouping_speedup']:.3f}x; wrote {path}"
    )


if __name__ == "__main__":
    main()
