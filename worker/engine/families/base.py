"""What differs between model families, behind one interface, and the registry of the families.

A family adapter owns everything that depends on how a family's models read a prompt and score labels:
recognising its models, loading them, where a template's [MASK] (the answer) goes, the extra inputs of a
forward pass, reading the label words' logits from the output, the PEFT config, and the parameter count.
The engine, the template and the scoring ask the adapter of the backbone's family and never name a family.

Adding a family: one module in this package whose adapter class is decorated with `@register` (every
module here is imported with the package, so nothing else lists it), and its name in shared.vocab.Family
(what a federation's spec accepts). The coordinator exports a family's prompts as PEFT adapters with the
task type in shared.vocab.PEFT_TASK_TYPES, the one family fact it needs without torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import torch
from fedprompt.shared.methods import MethodConfig, peft_fields
from fedprompt.shared.vocab import PEFT_TASK_TYPES, Scoring
from fedprompt.worker.engine.methods import model_shape
from fedprompt.worker.engine.model import Backbone, HeadChoice, input_embeddings_of, quiet_transformers
from fedprompt.worker.engine.params import count_parameters
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ScoreReading = Literal["label-words", "mean-pool"]


class FamilyAdapter(ABC):
    """One model family's side of the engine. Subclasses set `name` (a shared.vocab.Family value) and
    register with `@register`; one instance per family serves every engine."""

    name: ClassVar[str]
    # detect() asks the adapters in this order (lowest first); the first that claims a model has it
    detect_rank: ClassVar[int] = 50

    # ------------------------------------------------------------------ recognising and loading

    @abstractmethod
    def claims(self, config: Any, model: nn.Module | None = None) -> bool:
        """Whether a model (its transformers config, and its class when built in memory) is of this family."""

    @abstractmethod
    def load(self, path: str, config: Any) -> Backbone:
        """The backbone of a checkpoint folder or hub id whose config this family claimed."""

    @abstractmethod
    def backbone_of(self, model: PreTrainedModel, head: HeadChoice = "auto") -> Backbone:
        """The backbone of a built transformers model of this family."""

    # ------------------------------------------------------------------ template: where the answer goes

    @abstractmethod
    def mask_id(self, tokenizer: Any) -> int | None:
        """The token that stands for [MASK], or None when the label word is the next token after the text
        before [MASK] (nothing is put in its place). Raises TemplateError when the tokenizer has none."""

    def template_text(self, template: str) -> str:
        """The template as this family reads it (the whole of it by default)."""
        return template

    def assemble(
        self, prefix: list[int], body: list[int], suffix: list[int], mask_at: int
    ) -> tuple[list[int], int]:
        """(token ids, position whose output reads the label words) of an encoded body; `mask_at` is where
        [MASK] stands in the body, `prefix` / `suffix` are the tokenizer's special tokens around a sequence."""
        # Special tokens only wrap the body, so the mask moved by the number of leading specials.
        return prefix + body + suffix, len(prefix) + mask_at

    # ------------------------------------------------------------------ scoring

    def resolve_scoring(self, scoring: Scoring, backbone: Backbone) -> ScoreReading:
        """How label scores are read for a scoring choice: the label words through the model's head;
        mean-pool similarity only where the family has an encoder to pool."""
        if scoring == Scoring.MEAN_POOL:
            raise ValueError("mean-pool scoring needs an encoder (a masked LM such as BERT or MiniLM)")
        return "label-words"

    def model_inputs(self, backbone: Backbone, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Inputs of a forward pass besides input_ids and attention_mask (none by default)."""
        return {}

    @abstractmethod
    def word_logits(
        self, backbone: Backbone, out: Any, rows: torch.Tensor, at: torch.Tensor, word_ids: torch.Tensor
    ) -> torch.Tensor:
        """[batch, num_words] logits of the label words from the PEFT model's output `out`; `at` holds the
        position of each row's answer (virtual tokens included)."""

    # ------------------------------------------------------------------ the prompt method and the model's size

    @property
    def peft_task_type(self) -> str:
        """PEFT's task type, i.e. how PEFT wraps the family's models (shared.vocab.PEFT_TASK_TYPES)."""
        return PEFT_TASK_TYPES[self.name]

    def check_method(self, cfg: MethodConfig, config: Any) -> None:
        """Refuse (MethodError) a prompt method that cannot reach a model of this family (none by default)."""
        return None

    def peft_config(self, cfg: MethodConfig, config: Any) -> Any:
        """PEFT's config of a method for a model: shared.methods.peft_fields, trainable."""
        from peft import PrefixTuningConfig, PromptEncoderConfig, PromptTuningConfig

        self.check_method(cfg, config)
        _, _, heads = model_shape(config)
        fields = peft_fields(cfg, task_type=self.peft_task_type, num_attention_heads=heads)
        classes = {
            "PROMPT_TUNING": PromptTuningConfig,
            "P_TUNING": PromptEncoderConfig,
            "PREFIX_TUNING": PrefixTuningConfig,
        }
        return classes[fields.pop("peft_type")](**fields)

    def count_parameters(self, config: Any) -> int:
        """Parameters of the checkpoint's architecture (from its config alone, tied weights once)."""
        return count_parameters(config)


class LanguageModelAdapter(FamilyAdapter):
    """A family whose models run whole and read the label words from their vocabulary logits."""

    @abstractmethod
    def auto_class(self) -> Any:
        """The transformers auto class that loads the family's checkpoints."""

    def load(self, path: str, config: Any) -> Backbone:
        with quiet_transformers():
            return self.backbone_of(self.auto_class().from_pretrained(path))

    def backbone_of(self, model: PreTrainedModel, head: HeadChoice = "auto") -> Backbone:
        return Backbone(model, "lm", None, model, input_embeddings_of(model), model.config, self.name)


# ---------------------------------------------------------------------- the registry

_REGISTRY: dict[str, FamilyAdapter] = {}
A = TypeVar("A", bound=type[FamilyAdapter])


def register(cls: A) -> A:
    """Class decorator: serve the family `cls.name` with an instance of `cls` (a later class of the same
    name replaces the earlier)."""
    _REGISTRY[cls.name] = cls()
    return cls


def unregister(name: str) -> None:
    """Forget a family (tests that register one of their own)."""
    _REGISTRY.pop(name, None)


def registry() -> Mapping[str, FamilyAdapter]:
    """Family name → its adapter (read-only)."""
    return MappingProxyType(_REGISTRY)


def adapter(family: str) -> FamilyAdapter:
    """The adapter of a family."""
    try:
        return _REGISTRY[family]
    except KeyError:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(_REGISTRY)}") from None


def detect(config: Any, model: nn.Module | None = None) -> str:
    """The family of a model, from its config (and class, when built in memory)."""
    for candidate in sorted(_REGISTRY.values(), key=lambda a: a.detect_rank):
        if candidate.claims(config, model):
            return candidate.name
    raise ValueError(f"no model family claims {getattr(config, 'model_type', type(config).__name__)!r}")
