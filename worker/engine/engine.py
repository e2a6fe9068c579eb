"""PromptEngine: a frozen PLM plus a trainable soft prompt, read out through a template and verbalizer."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from shared import wire
from shared.methods import PROMPT_TENSOR, EncoderType, Method, MethodConfig, peft_state_names, tensor_shapes
from shared.spec import FederationSpec
from worker.engine.batching import cycle_batches, pad
from worker.engine.methods import model_shape, wrap
from worker.engine.model import (
    Backbone,
    Head,
    default_num_threads,
    describe_model,
    describe_objects,
    detect_family,
    encoder_only,
    fingerprint_of,
    language_model,
    load_backbone,
    pick_device,
    resolve_model,
    split_masked_lm,
)
from worker.engine.results import EvalResult, TrainResult
from worker.engine.scoring import Scoring, phrase_embeddings, pooled_scores, resolve_scoring
from worker.engine.template import Template, TextPair, Verbalizer

Init = Literal["random", "vocab", "label"]
ProgressFn = Callable[[int, int, float], None]

# Lester et al. draw the initial prompt from the 5,000 most common tokens; BERT-style vocabularies are
# roughly ordered by frequency, so the first word-like ids approximate that.
_VOCAB_INIT_POOL = 5000


class PromptError(ValueError):
    """A prompt whose tensor names, shapes or values do not fit this engine."""


def _interleave(groups: Sequence[Sequence[int]]) -> list[int]:
    """[[a1, a2], [b1]] → [a1, b1, a2]: one word of each label in turn."""
    out: list[str] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


class PromptEngine:
    """A frozen PLM with a trainable prompt method (prompt tuning, P-tuning or prefix tuning, via HF PEFT)."""

    def __init__(
        self,
        backbone: Backbone,
        tokenizer: Any,
        *,
        template: str,
        verbalizer: Sequence[Sequence[str]],
        num_virtual_tokens: int = 20,
        max_length: int = 128,
        init: Init = "vocab",
        init_std: float = 0.5,
        seed: int = 0,
        device: str = "auto",
        num_threads: int | None = None,
        fingerprint: str = "",
        description: dict[str, Any] | None = None,
        method: Method = "prompt_tuning",
        encoder_type: EncoderType = "mlp",
        encoder_hidden_size: int | None = None,
        encoder_num_layers: int = 2,
        prefix_projection: bool = False,
        scoring: Scoring = "auto",
    ) -> None:
        if num_virtual_tokens < 1:
            raise ValueError(f"num_virtual_tokens must be >= 1; got {num_virtual_tokens}")
        self.device = pick_device(device)
        if self.device.type == "cpu":
            torch.set_num_threads(num_threads or default_num_threads())
        self.tokenizer = tokenizer
        self.family = backbone.family
        self.template = Template(template, tokenizer, max_length, backbone.family)
        self.verbalizer = Verbalizer(verbalizer, tokenizer)
        self.num_virtual_tokens = num_virtual_tokens
        self.max_length = max_length
        self.fingerprint = fingerprint
        self.description = description or {}
        self._backbone = backbone
        self.head: Head = backbone.head
        self.scoring = resolve_scoring(scoring, backbone)
        self.hidden_size = int(backbone.input_embeddings.weight.shape[1])
        self._check_positions(backbone.config)

        for module in (backbone.encoder, backbone.mlm_head, backbone.full_model):
            if module is not None:
                module.requires_grad_(False)
                # Dropout off: the PLM is frozen and a fixed forward makes training reproducible.
                module.eval()
                module.to(self.device)

        _, num_layers, self.num_attention_heads = model_shape(backbone.config)
        self.method_config = MethodConfig(
            method=method,
            num_virtual_tokens=num_virtual_tokens,
            hidden_size=self.hidden_size,
            num_layers=num_layers,
            encoder_type=encoder_type,
            encoder_hidden_size=encoder_hidden_size,
            encoder_num_layers=encoder_num_layers,
            prefix_projection=prefix_projection,
        )
        self.method = method
        # PEFT initialises the encoder's layers from torch's global RNG: seed it so a seed means one prompt.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self._peft, self._encoder = wrap(backbone, self.method_config)
        self._encoder.to(self.device)
        module_params = dict(self._encoder.named_parameters())
        self._params: dict[str, nn.Parameter] = {
            wire_name: module_params[name] for wire_name, name in peft_state_names(self.method_config).items()
        }
        self._initialise(init, init_std, seed)
        if self.family == "seq2seq":
            start = getattr(backbone.config, "decoder_start_token_id", None)
            self._decoder_start = int(start if start is not None else (backbone.config.pad_token_id or 0))
        self._word_ids = torch.tensor(self.verbalizer.word_ids, dtype=torch.long, device=self.device)
        # scores = word_logits @ average.T: the mean over each label's words as one matmul.
        average = torch.zeros(self.verbalizer.num_labels, len(self.verbalizer.word_ids))
        for j, label in enumerate(self.verbalizer.word_label):
            average[label, j] = 1.0
        self._average = (average / average.sum(dim=1, keepdim=True)).to(self.device)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._label_embeddings = (
            phrase_embeddings(backbone.encoder, tokenizer, self.template, self.verbalizer, self.device)
            if self.scoring == "mean-pool"
            else None
        )

    # ------------------------------------------------------------------ construction

    @property
    def prompt(self) -> nn.Parameter:
        """The virtual-token embeddings (prompt tuning, prefixes) or the encoder's input embeddings (P-tuning)."""
        if PROMPT_TENSOR in self._params:
            return self._params[PROMPT_TENSOR]
        return self._params["prompt_encoder.embedding.weight"]

    def _initialise(self, init: Init, init_std: float, seed: int) -> None:
        shapes = tensor_shapes(self.method_config)
        if init == "random":
            # The same stream as shared.spec.initial_prompt, so a seed means the same prompt everywhere.
            rng = np.random.default_rng([seed, 0xF0])
            values = {
                n: (rng.standard_normal(shape) * init_std).astype(np.float32) for n, shape in shapes.items()
            }
            self.set_prompt(values)
            return
        if init not in ("vocab", "label"):
            raise ValueError(f"init must be 'random', 'vocab' or 'label'; got {init!r}")
        target = self.prompt
        if tuple(target.shape) != (self.num_virtual_tokens, self.hidden_size):
            # Un-projected prefixes are keys and values, not word embeddings: seeded Gaussian instead.
            rng = np.random.default_rng([seed, 0xF0])
            value = torch.from_numpy((rng.standard_normal(tuple(target.shape)) * init_std).astype(np.float32))
        else:
            value = self._initial_prompt(init, init_std, seed)
        with torch.no_grad():
            target.copy_(value.to(self.device))

    @classmethod
    def load(
        cls,
        model: str,
        *,
        template: str,
        verbalizer: Sequence[Sequence[str]],
        num_virtual_tokens: int = 20,
        max_length: int = 128,
        init: Init = "vocab",
        init_std: float = 0.5,
        seed: int = 0,
        device: str = "auto",
        num_threads: int | None = None,
        **method: Any,
    ) -> PromptEngine:
        """Load a PLM by hub id or local path ('all-MiniLM-L6-v2' → the offline package) and wrap it.

        ``method`` takes the method options of the constructor (method, encoder_type, encoder_hidden_size,
        encoder_num_layers, prefix_projection) and its scoring.
        """
        from transformers import AutoTokenizer

        path = resolve_model(model)
        tokenizer = AutoTokenizer.from_pretrained(path)
        backbone = load_backbone(path)
        description = describe_model(path)
        return cls(
            backbone,
            tokenizer,
            template=template,
            verbalizer=verbalizer,
            num_virtual_tokens=num_virtual_tokens,
            max_length=max_length,
            init=init,
            init_std=init_std,
            seed=seed,
            device=device,
            num_threads=num_threads,
            fingerprint=fingerprint_of(description),
            description=description,
            **method,
        )

    @classmethod
    def from_spec(
        cls, spec: FederationSpec, *, device: str = "auto", num_threads: int | None = None
    ) -> PromptEngine:
        """The engine a federation's spec describes: its model, template, verbalizer and prompt method."""
        return cls.load(
            spec.model,
            template=spec.template,
            verbalizer=spec.verbalizer,
            num_virtual_tokens=spec.num_virtual_tokens,
            max_length=spec.max_length,
            seed=spec.seed,
            device=device,
            num_threads=num_threads,
            method=spec.method,
            encoder_type=spec.encoder_type,
            encoder_hidden_size=spec.encoder_hidden_size,
            encoder_num_layers=spec.encoder_num_layers,
            prefix_projection=spec.prefix_projection,
            scoring=spec.scoring,
        )

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        tokenizer: Any,
        *,
        template: str,
        verbalizer: Sequence[Sequence[str]],
        head: Literal["auto", "mlm", "tied-embeddings"] = "auto",
        **kwargs: Any,
    ) -> PromptEngine:
        """Wrap a built transformers model: a *ForMaskedLM or bare encoder, a causal LM, or a seq2seq LM."""
        if detect_family(model.config, model) != "masked_lm":
            backbone = language_model(model)
            description = describe_objects(model.config, tokenizer)
            kwargs.setdefault("fingerprint", fingerprint_of(description))
            kwargs.setdefault("description", description)
            return cls(backbone, tokenizer, template=template, verbalizer=verbalizer, **kwargs)
        if head == "mlm" and model.get_output_embeddings() is None:
            raise ValueError(f"{type(model).__name__} has no MLM head; use head='auto' or 'tied-embeddings'")
        if model.get_output_embeddings() is None or head == "tied-embeddings":
            backbone = encoder_only(model.base_model if head == "tied-embeddings" else model)
        else:
            backbone = split_masked_lm(model)
        description = describe_objects(model.config, tokenizer)
        kwargs.setdefault("fingerprint", fingerprint_of(description))
        kwargs.setdefault("description", description)
        return cls(backbone, tokenizer, template=template, verbalizer=verbalizer, **kwargs)

    def _check_positions(self, config: Any) -> None:
        limit = getattr(config, "max_position_embeddings", None)
        if limit is None:
            return
        # RoBERTa-style models number positions from padding_idx + 1.
        if getattr(config, "model_type", "") in {"roberta", "xlm-roberta", "camembert", "longformer"}:
            limit -= (config.pad_token_id or 0) + 1
        if self.num_virtual_tokens + self.max_length > limit:
            raise ValueError(
                f"num_virtual_tokens ({self.num_virtual_tokens}) + max_length ({self.max_length}) exceeds the "
                f"model's {limit} positions"
            )

    def _initial_prompt(self, init: Init, init_std: float, seed: int) -> torch.Tensor:
        shape = (self.num_virtual_tokens, self.hidden_size)
        if init == "random":
            # The same stream as shared.spec.initial_prompt, so a seed means the same prompt everywhere.
            rng = np.random.default_rng([seed, 0xF0])
            return torch.from_numpy((rng.standard_normal(shape) * init_std).astype(np.float32))
        if init in ("vocab", "label"):
            pool = self._vocab_pool()
            rng = np.random.default_rng([seed, 0xF1])
            ids = rng.choice(pool, size=self.num_virtual_tokens, replace=len(pool) < self.num_virtual_tokens)
            if init == "label":
                # Lester et al. (2021): the first virtual tokens start as the class label words, in label
                # order (the words of each label interleaved), the rest as sampled vocabulary.
                verb = self.verbalizer
                groups = [
                    [w for w, lab in zip(verb.word_ids, verb.word_label, strict=True) if lab == label]
                    for label in range(verb.num_labels)
                ]
                words = _interleave(groups)[: self.num_virtual_tokens]
                ids[: len(words)] = words
            weight = self._backbone.input_embeddings.weight.detach()
            return weight[torch.as_tensor(ids, dtype=torch.long)].float().cpu().clone()
        raise ValueError(f"init must be 'random', 'vocab' or 'label'; got {init!r}")

    def _vocab_pool(self) -> np.ndarray:
        special = set(self.tokenizer.all_special_ids)
        pool: list[int] = []
        for token, idx in sorted(self.tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
            word = token.lstrip("Ġ▁")
            if idx not in special and len(word) >= 2 and word.isalpha() and word.isascii():
                pool.append(idx)
                if len(pool) >= _VOCAB_INIT_POOL:
                    break
        if not pool:
            raise ValueError("the vocabulary has no word-like tokens to initialise the prompt from")
        return np.asarray(pool)

    # ------------------------------------------------------------------ forward

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _batch(self, examples: Sequence[TextPair]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        encoded = self.template.encode(examples)
        ids, mask = pad(encoded.input_ids, self._pad_id)
        positions = torch.tensor(encoded.mask_positions, dtype=torch.long)
        return ids.to(self.device), mask.to(self.device), positions.to(self.device)

    def scores(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask_pos: torch.Tensor
    ) -> torch.Tensor:
        """Label scores [batch, num_labels] for encoded inputs, through the prompt method."""
        batch = input_ids.shape[0]
        rows = torch.arange(batch, device=input_ids.device)
        # Prompt tuning and P-tuning prepend virtual tokens; prefixes sit in the attention cache instead.
        at = mask_pos + (0 if self.method == "prefix_tuning" else self.num_virtual_tokens)
        bb = self._backbone
        kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.family == "seq2seq":
            kwargs["decoder_input_ids"] = torch.full(
                (batch, 1), self._decoder_start, dtype=torch.long, device=input_ids.device
            )
        out = self._peft(**kwargs)
        if self._label_embeddings is not None:
            return pooled_scores(out.last_hidden_state, attention_mask, self._label_embeddings)
        if self.family == "seq2seq":
            # The first decoder token reads the label word.
            word_logits = out.logits[:, 0][:, self._word_ids]
        elif bb.full_model is not None:
            # Causal LM (next token after the template), or a masked LM without a separable head (DistilBERT).
            word_logits = out.logits[rows, at][:, self._word_ids]
        else:
            hidden = out.last_hidden_state[rows, at]
            if bb.mlm_head is not None:
                word_logits = bb.mlm_head(hidden)[:, self._word_ids]
            else:
                # No trained MLM head in the checkpoint: read the label words through the tied input embeddings.
                word_logits = hidden @ bb.input_embeddings.weight[self._word_ids].T
        return word_logits.float() @ self._average.T

    # ------------------------------------------------------------------ training and evaluation

    def train(
        self,
        examples: Sequence[TextPair | Any],
        *,
        steps: int,
        batch_size: int = 16,
        lr: float = 0.3,
        grad_clip: float = 1.0,
        seed: int = 0,
        weight_decay: float = 0.0,
        progress: ProgressFn | None = None,
    ) -> TrainResult:
        """Run `steps` AdamW steps on the method's tensors only (a fresh optimiser per call), seeded batches."""
        if not examples:
            raise ValueError("cannot train on an empty data set")
        if steps < 0:
            raise ValueError(f"steps must be >= 0; got {steps}")
        labels = self._labels(examples)
        params = list(self._params.values())
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        batches = cycle_batches(len(examples), batch_size, np.random.default_rng([seed, 0xBA]))
        started = time.perf_counter()
        losses: list[float] = []
        for step in range(1, steps + 1):
            idx = next(batches)
            ids, mask, pos = self._batch([examples[i] for i in idx])
            target = labels[torch.as_tensor(idx)].to(self.device)
            with self._autocast():
                scores = self.scores(ids, mask, pos)
            loss = F.cross_entropy(scores, target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            optimizer.step()
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(
                    f"training loss became {value} at step {step}; lower the learning rate"
                )
            losses.append(value)
            if progress is not None:
                progress(step, steps, value)
        seconds = time.perf_counter() - started
        return TrainResult(
            steps=steps,
            mean_loss=float(np.mean(losses)) if losses else float("nan"),
            last_loss=losses[-1] if losses else float("nan"),
            seconds=seconds,
            num_examples=len(examples),
        )

    def _labels(self, examples: Sequence[Any]) -> torch.Tensor:
        labels = torch.tensor([int(ex.label) for ex in examples], dtype=torch.long)
        bad = (labels < 0) | (labels >= self.verbalizer.num_labels)
        if bool(bad.any()):
            first = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"example {first} has label {int(labels[first])}; the verbalizer has "
                f"{self.verbalizer.num_labels} labels (0..{self.verbalizer.num_labels - 1})"
            )
        return labels

    @torch.inference_mode()
    def evaluate(self, examples: Sequence[TextPair | Any], *, batch_size: int = 64) -> EvalResult:
        """Accuracy, mean cross-entropy and per-class counts of the current prompt on labelled examples."""
        started = time.perf_counter()
        k = self.verbalizer.num_labels
        confusion = np.zeros((k, k), dtype=np.int64)
        if not examples:
            return EvalResult(0.0, float("nan"), 0, [0] * k, [0] * k, confusion.tolist(), 0.0)
        labels = self._labels(examples)
        # Batching examples of similar length wastes less compute on padding.
        encoded = self.template.encode(examples)
        order = sorted(range(len(examples)), key=lambda i: len(encoded.input_ids[i]))
        total_loss = 0.0
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            ids, mask = pad([encoded.input_ids[i] for i in idx], self._pad_id)
            pos = torch.tensor([encoded.mask_positions[i] for i in idx], dtype=torch.long)
            target = labels[idx]
            with self._autocast():
                scores = self.scores(ids.to(self.device), mask.to(self.device), pos.to(self.device)).cpu()
            total_loss += float(F.cross_entropy(scores, target, reduction="sum"))
            np.add.at(confusion, (target.numpy(), scores.argmax(dim=1).numpy()), 1)
        correct = np.diag(confusion)
        return EvalResult(
            accuracy=float(correct.sum() / len(examples)),
            loss=total_loss / len(examples),
            n=len(examples),
            correct=[int(c) for c in correct],
            total=[int(t) for t in confusion.sum(axis=1)],
            confusion=confusion.tolist(),
            seconds=time.perf_counter() - started,
        )

    @torch.inference_mode()
    def predict(self, examples: Sequence[TextPair], *, batch_size: int = 64) -> list[int]:
        """Predicted label ids."""
        predictions: list[int] = []
        for start in range(0, len(examples), batch_size):
            ids, mask, pos = self._batch(examples[start : start + batch_size])
            with self._autocast():
                predictions.extend(int(p) for p in self.scores(ids, mask, pos).argmax(dim=1).cpu())
        return predictions

    # ------------------------------------------------------------------ state

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the communicated (trainable) tensors."""
        return tensor_shapes(self.method_config)

    def trainable_parameters(self) -> dict[str, nn.Parameter]:
        """Every tensor that receives gradients, keyed by wire name: exactly the method's tensors."""
        return dict(self._params)

    def frozen_modules(self) -> list[nn.Module]:
        """The PLM modules that are never trained."""
        bb = self._backbone
        modules: list[nn.Module] = []
        for m in (bb.encoder, bb.mlm_head, bb.full_model):
            if m is not None and all(m is not seen for seen in modules):
                modules.append(m)
        return modules

    def model_parameters(self) -> int:
        """Parameters of the checkpoint's architecture (from its config, tied weights once): the full model."""
        from worker.engine.params import count_parameters

        return count_parameters(self._backbone.config)

    def get_prompt(self) -> dict[str, np.ndarray]:
        """A float32 copy of the trainable tensors, keyed by their wire names."""
        return {name: p.detach().float().cpu().numpy().copy() for name, p in self._params.items()}

    def set_prompt(self, tensors: Mapping[str, np.ndarray | torch.Tensor]) -> None:
        """Replace the method's tensors; names and shapes must match exactly and values must be finite."""
        expected = self.tensor_shapes()
        missing = sorted(set(expected) - set(tensors))
        extra = sorted(set(tensors) - set(expected))
        if missing or extra:
            raise PromptError(
                f"prompt tensors do not match this engine: missing {missing}, unexpected {extra}; "
                f"expected exactly {sorted(expected)}"
            )
        values: dict[str, torch.Tensor] = {}
        for name, shape in expected.items():
            value = tensors[name]
            array = (
                value.detach().cpu()
                if isinstance(value, torch.Tensor)
                else torch.from_numpy(np.asarray(value))
            )
            if tuple(array.shape) != shape:
                raise PromptError(
                    f"prompt tensor '{name}' has shape {list(array.shape)}; expected {list(shape)} "
                    f"(method={self.method}, num_virtual_tokens={self.num_virtual_tokens}, "
                    f"hidden_size={self.hidden_size})"
                )
            if not array.is_floating_point():
                raise PromptError(f"prompt tensor '{name}' has dtype {array.dtype}; expected float32")
            array = array.to(torch.float32)
            if not bool(torch.isfinite(array).all()):
                raise PromptError(f"prompt tensor '{name}' contains NaN or Inf values")
            values[name] = array
        with torch.no_grad():
            for name, value in values.items():
                self._params[name].copy_(value.to(self.device))

    def save_prompt(self, metadata: Mapping[str, Any] | None = None) -> bytes:
        """The prompt as safetensors bytes (shared.wire format) with the caller's metadata."""
        return wire.encode(self.get_prompt(), metadata)

    def load_prompt(self, data: bytes, *, check_fingerprint: bool = False) -> dict[str, str]:
        """Set the prompt from safetensors bytes and return their metadata."""
        tensors, meta = wire.decode(data)
        if check_fingerprint and meta.get("model_fingerprint", self.fingerprint) != self.fingerprint:
            raise PromptError(
                f"prompt was made for model {meta['model_fingerprint']}; this engine's model is {self.fingerprint}"
            )
        self.set_prompt(tensors)
        return meta
