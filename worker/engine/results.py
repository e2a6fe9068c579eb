"""What the engine's training and evaluation report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TrainResult:
    """What one call of PromptEngine.train did."""

    steps: int
    mean_loss: float
    last_loss: float
    seconds: float
    num_examples: int

    @property
    def seconds_per_step(self) -> float:
        """Wall-clock seconds per optimisation step."""
        return self.seconds / self.steps if self.steps else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {**asdict(self), "seconds_per_step": self.seconds_per_step}


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

    @property
    def per_class_accuracy(self) -> list[float | None]:
        """Recall of each label (None for a label absent from the data)."""
        return [c / t if t else None for c, t in zip(self.correct, self.total, strict=True)]

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {**asdict(self), "per_class_accuracy": self.per_class_accuracy}
