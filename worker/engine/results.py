"""What the engine's training and evaluation report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass
class TrainResult:
    """What one call of PromptEngine.train did."""

    steps: int
    mean_loss: float
    last_loss: float
    seconds: float
    num_examples: int
    # the mean (clipped) loss gradient per communicated tensor over the steps, when asked for
    # (SCAFFOLD's new client control variate); left out of to_dict
    mean_gradient: dict[str, np.ndarray] | None = field(default=None, repr=False)

    @classmethod
    def from_losses(
        cls,
        losses: list[float],
        *,
        seconds: float,
        num_examples: int,
        mean_gradient: dict[str, np.ndarray] | None = None,
    ) -> TrainResult:
        """The report of a run whose steps had these losses."""
        return cls(
            steps=len(losses),
            mean_loss=float(np.mean(losses)) if losses else float("nan"),
            last_loss=losses[-1] if losses else float("nan"),
            seconds=seconds,
            num_examples=num_examples,
            mean_gradient=mean_gradient,
        )

    @property
    def seconds_per_step(self) -> float:
        """Wall-clock seconds per optimisation step."""
        return self.seconds / self.steps if self.steps else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        out = {k: v for k, v in asdict(self).items() if k != "mean_gradient"}
        return {**out, "seconds_per_step": self.seconds_per_step}


@dataclass
class EvalResult:
    """Accuracy, mean cross-entropy and per-class counts of one evaluation."""

    accuracy: float
    loss: float
    n: int
    correct: list[int] = field(default_factory=list)
    total: list[int] = field(default_factory=list)
    confusion: list[list[int]] = field(default_factory=list)  # confusion[true][predicted]
    seconds: float = 0.0

    @classmethod
    def from_confusion(cls, confusion: np.ndarray, loss_sum: float, seconds: float) -> EvalResult:
        """The report of an evaluation from its counts (confusion[true][predicted]) and summed loss."""
        correct = np.diag(confusion)
        n = int(confusion.sum())
        return cls(
            accuracy=float(correct.sum() / n) if n else 0.0,
            loss=loss_sum / n if n else float("nan"),
            n=n,
            correct=[int(c) for c in correct],
            total=[int(t) for t in confusion.sum(axis=1)],
            confusion=confusion.tolist(),
            seconds=seconds,
        )

    @property
    def per_class_accuracy(self) -> list[float | None]:
        """Recall of each label (None for a label absent from the data)."""
        return [c / t if t else None for c, t in zip(self.correct, self.total, strict=True)]

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {**asdict(self), "per_class_accuracy": self.per_class_accuracy}
