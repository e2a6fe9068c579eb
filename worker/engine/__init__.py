"""The worker's model side: a frozen PLM plus a trainable soft prompt (pure torch + transformers, no HTTP)."""

from fedprompt.worker.engine.engine import PromptEngine
from fedprompt.worker.engine.model import ModelError, describe_model, model_fingerprint, pick_device
from fedprompt.worker.engine.offline import MINILM_ALIASES, SMOLLM2_ALIASES, OfflineModelError, resolve_model
from fedprompt.worker.engine.prompt_io import PromptError
from fedprompt.worker.engine.results import EvalResult, TrainResult
from fedprompt.worker.engine.template import Template, TemplateError, Verbalizer

__all__ = [
    "MINILM_ALIASES",
    "EvalResult",
    "ModelError",
    "OfflineModelError",
    "PromptEngine",
    "SMOLLM2_ALIASES",
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
