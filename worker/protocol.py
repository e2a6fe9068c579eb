"""What the agent needs of an engine (PromptEngine is one; tests use small fakes): a Protocol, so the
agent and the pool are typed without importing torch."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from fedprompt.shared.spec import FederationSpec


class TrainOutcome(Protocol):
    """What a local training run reports."""

    mean_loss: float
    last_loss: float
    seconds: float
    # the mean loss gradient per communicated tensor, when training was asked for it (SCAFFOLD)
    mean_gradient: dict[str, np.ndarray] | None


class EvalOutcome(Protocol):
    """What an evaluation reports (PromptEngine's EvalResult also has per-class counts and a confusion)."""

    accuracy: float
    loss: float
    n: int


class Engine(Protocol):
    """A frozen model with a trainable prompt: load, train, evaluate and save the prompt."""

    fingerprint: str

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the communicated tensors."""
        ...

    def load_prompt(self, data: bytes) -> dict[str, str]:
        """Replace the prompt with a safetensors blob's tensors; its metadata."""
        ...

    def train(
        self,
        examples: Sequence[Any],
        *,
        steps: int,
        batch_size: int = ...,
        lr: float = ...,
        grad_clip: float = ...,
        optimizer: str = ...,
        seed: int = ...,
        prox_mu: float = ...,
        correction: Mapping[str, np.ndarray] | None = ...,
        mean_gradient: bool = ...,
        balanced_tau: float = ...,
        progress: Callable[[int, int, float], None],
    ) -> TrainOutcome:
        """`steps` optimisation steps of the prompt on the examples (`optimizer`: adamw or sgd); FedProx's `prox_mu`, SCAFFOLD's
        `correction` and `mean_gradient`, and the balanced loss's `balanced_tau` as in shared/drift.py."""
        ...

    def evaluate(self, examples: Sequence[Any], *, batch_size: int = 64) -> EvalOutcome:
        """Accuracy and loss of the current prompt on labelled examples."""
        ...

    def save_prompt(self, metadata: Mapping[str, Any] | None = None) -> bytes:
        """The prompt as a safetensors blob."""
        ...

    def get_prompt(self) -> dict[str, np.ndarray]:
        """The prompt's tensors."""
        ...


EngineFactory = Callable[[FederationSpec, str], Engine]
