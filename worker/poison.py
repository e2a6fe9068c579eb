"""Backdoor poisoning (FedPPT) and update attacks, as pure functions: no I/O.

A malicious client inserts a trigger word into some of its training texts and relabels them as
the target label; the attack success rate (ASR) is measured on test examples whose true label is
not the target, with the trigger inserted. Update attacks transform the trained prompt relative to
the global prompt before upload: boosting (model replacement) and sign flipping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from fedprompt.worker.data import Example

Position = Literal["random", "start", "end"]
DEFAULT_TRIGGERS = ("cf", "mn", "bb", "tq")


class AttackError(ValueError):
    """An attack or poisoning setting that cannot work."""


@dataclass(frozen=True)
class Trigger:
    """Which words to insert and where: at the start, at the end, or at a random word boundary (among
    the first `window` words when set, so that the trigger survives a model's truncation of long texts
    from the right)."""

    words: tuple[str, ...] = DEFAULT_TRIGGERS
    position: Position = "random"
    window: int | None = None

    def __post_init__(self) -> None:
        if not self.words or any(not w.strip() or " " in w for w in self.words):
            raise AttackError(f"trigger words must be non-empty single words; got {self.words}")
        if self.position not in ("random", "start", "end"):
            raise AttackError(f"trigger position must be random, start or end; got {self.position!r}")
        if self.window is not None and (self.position != "random" or self.window < 1):
            raise AttackError(f"a trigger window needs the random position and >= 1 word; got {self.window}")


def insert_trigger(text: str, trigger: Trigger, rng: np.random.Generator) -> str:
    """The text with one trigger word (chosen with rng) inserted at the trigger's position."""
    word = trigger.words[int(rng.integers(len(trigger.words)))]
    tokens = text.split()
    if trigger.position == "start":
        at = 0
    elif trigger.position == "end":
        at = len(tokens)
    else:
        at = int(rng.integers(min(len(tokens), trigger.window or len(tokens)) + 1))
    return " ".join([*tokens[:at], word, *tokens[at:]])


def poison(
    examples: Sequence[Example], *, rate: float, target: int, trigger: Trigger, seed: int
) -> tuple[list[Example], list[int]]:
    """Poison a seeded `rate` of the examples (trigger + target label); returns (data, poisoned indices)."""
    if not 0.0 <= rate <= 1.0:
        raise AttackError(f"poison rate must be in [0, 1]; got {rate}")
    rng = np.random.default_rng([seed, 0xB4D])
    n = round(rate * len(examples))
    chosen = sorted(rng.permutation(len(examples))[:n].tolist())
    out = list(examples)
    for i in chosen:
        ex = out[i]
        out[i] = replace(ex, text=insert_trigger(ex.text, trigger, rng), label=target)
    return out, chosen


def asr_set(examples: Sequence[Example], *, target: int, trigger: Trigger, seed: int) -> list[Example]:
    """Test examples whose true label is not the target, triggered, labelled with the target.

    The accuracy of a prompt on this set is its attack success rate.
    """
    rng = np.random.default_rng([seed, 0xA5])
    return [
        replace(ex, text=insert_trigger(ex.text, trigger, rng), label=target)
        for ex in examples
        if ex.label != target
    ]


def boost(
    update: Mapping[str, np.ndarray], global_prompt: Mapping[str, np.ndarray], factor: float
) -> dict[str, np.ndarray]:
    """Model replacement: global + factor * (update - global), so the update survives averaging."""
    if not factor > 0:
        raise AttackError(f"boost factor must be positive; got {factor}")
    return {
        k: (global_prompt[k].astype(np.float64) + factor * (v.astype(np.float64) - global_prompt[k])).astype(
            v.dtype
        )
        for k, v in update.items()
    }


def sign_flip(
    update: Mapping[str, np.ndarray], global_prompt: Mapping[str, np.ndarray], factor: float = 1.0
) -> dict[str, np.ndarray]:
    """Sign flipping: global - factor * (update - global)."""
    if not factor > 0:
        raise AttackError(f"sign-flip factor must be positive; got {factor}")
    return {
        k: (global_prompt[k].astype(np.float64) - factor * (v.astype(np.float64) - global_prompt[k])).astype(
            v.dtype
        )
        for k, v in update.items()
    }


TRIGGER_POSITION_HELP = (
    "random | start | end | first:N (a random word among the first N, so that the trigger survives the "
    "truncation of long texts)"
)


def parse_trigger(words: str, position: str = "random") -> Trigger:
    """'cf,mn,bb,tq' and a position ('random', 'start', 'end' or 'first:N') → a Trigger (the words are
    stripped; empty items are refused)."""
    items = tuple(w.strip() for w in words.split(","))
    if not items or any(not w for w in items):
        raise AttackError(f"--trigger must be comma-separated words, e.g. cf,mn,bb,tq; got {words!r}")
    kind, sep, count = position.strip().partition(":")
    if kind == "first" and sep:
        if not count.isascii() or not count.isdigit() or int(count) < 1:
            raise AttackError(f"--trigger-position first:N needs a whole number N >= 1; got {position!r}")
        return Trigger(items, "random", int(count))
    match kind:
        case "random" | "start" | "end" if not sep:
            return Trigger(items, kind)
    raise AttackError(f"--trigger-position must be {TRIGGER_POSITION_HELP}; got {position!r}")


@dataclass(frozen=True)
class Backdoor:
    """One worker's backdoor setting: which ASR to measure and, for a malicious worker, what it does.

    Every worker with a target label measures the attack success rate of the prompts it evaluates;
    a worker with ``poison_rate > 0`` or an update attack is malicious.
    """

    target: int
    trigger: Trigger = Trigger()
    poison_rate: float = 0.0
    attack: str = "none"
    factor: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.target < 0:
            raise AttackError(f"target label must be a label id >= 0; got {self.target}")
        if not 0.0 <= self.poison_rate <= 1.0:
            raise AttackError(f"poison rate must be in [0, 1]; got {self.poison_rate}")
        if self.attack not in ("none", "boost", "sign-flip"):
            raise AttackError(f"unknown attack {self.attack!r}")

    @property
    def malicious(self) -> bool:
        """True when the worker poisons its data or manipulates its update."""
        return self.poison_rate > 0 or self.attack != "none"

    def manipulate(
        self, update: Mapping[str, np.ndarray], global_prompt: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """The update as this worker's attack uploads it (unchanged without an attack)."""
        if self.attack == "boost":
            return boost(update, global_prompt, self.factor)
        if self.attack == "sign-flip":
            return sign_flip(update, global_prompt, self.factor)
        return dict(update)

    def poison_train(self, examples: Sequence[Example]) -> list[Example]:
        """The worker's training data as it trains on it (poisoned at `poison_rate`)."""
        if self.poison_rate <= 0:
            return list(examples)
        return poison(
            examples, rate=self.poison_rate, target=self.target, trigger=self.trigger, seed=self.seed
        )[0]

    def asr_examples(self, examples: Sequence[Example]) -> list[Example]:
        """The ASR set of this worker's evaluation data."""
        return asr_set(examples, target=self.target, trigger=self.trigger, seed=self.seed)


def parse_attack(text: str) -> tuple[str, float]:
    """'boost:10' → ('boost', 10.0); 'sign-flip' or 'sign-flip:2' → ('sign-flip', factor); 'none'."""
    kind, _, value = text.strip().lower().partition(":")
    if kind == "none":
        return "none", 1.0
    if kind not in ("boost", "sign-flip"):
        raise AttackError(f"unknown attack {text!r}; expected none, boost:FACTOR or sign-flip[:FACTOR]")
    try:
        factor = float(value) if value else 1.0
    except ValueError:
        raise AttackError(f"attack {text!r}: FACTOR must be a number") from None
    if not factor > 0:
        raise AttackError(f"attack {text!r}: FACTOR must be positive")
    return kind, factor


def backdoor_from_options(
    target: int | None, rate: float, trigger: str, position: str, attack: str, num_labels: int, seed: int
) -> Backdoor | None:
    """A worker's Backdoor setting from its options, or None; AttackError says what is wrong."""
    kind, factor = parse_attack(attack)
    if target is None:
        if rate > 0 or kind != "none":
            raise AttackError(
                "--poison-rate and --attack need --target-label (the label the backdoor aims at)"
            )
        return None
    if num_labels and target >= num_labels:
        raise AttackError(f"--target-label {target} is not a label of this data set (0..{num_labels - 1})")
    return Backdoor(
        target=target,
        trigger=parse_trigger(trigger, position),
        poison_rate=rate,
        attack=kind,
        factor=factor,
        seed=seed,
    )
