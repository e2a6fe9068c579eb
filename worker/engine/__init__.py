"""The worker's model side: a frozen PLM plus a trainable soft prompt (pure torch + transformers, no HTTP)."""

from worker.engine.engine import PromptEngine
from worker.engine.model import (
    MINILM_ALIASES,
    ModelError,
    describe_model,
    model_fingerprint,
    pick_device,
    resolve_model,
)
from worker.engine.prompt_io import PromptError
from worker.engine.results import EvalResult, TrainResult
from worker.engine.template import Template, TemplateError, Verbalizer

__all__ = [
    "MINILM_ALIASES",
    "EvalResult",
    "ModelError",
    "PromptEngine",
    "PromptError",
    "Template",
    "TemplateError",
    "TrainResult",
    "Verbalizer",
    "describe_model",
    "model_fingerprint",
    "pick_device",
    "resolve_model",
]
