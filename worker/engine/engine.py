"""PromptEngine: a frozen PLM plus a trainable soft prompt, read out through a template and verbalizer."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from fedprompt.shared import drift, wire
from fedprompt.shared.methods import PROMPT_TENSOR, MethodConfig, tensor_shapes
from fedprompt.shared.spec import FederationSpec, Precision, check_precision
from fedprompt.shared.vocab import EncoderType, LocalOptimizer, Method, Scoring
from fedprompt.worker.engine import prompt_io
from fedprompt.worker.engine.batching import LENGTH_WINDOW, cycle_batches, label_ids, length_batches, pad
from fedprompt.worker.engine.families import adapter
from fedprompt.worker.engine.initial import Init, initialise
from fedprompt.worker.engine.loading import (
    HeadChoice,
    backbone_of,
    check_positions,
    load_pretrained,
    spec_options,
)
from fedprompt.worker.engine.methods import attach, kv_size, model_shape
from fedprompt.worker.engine.model import (
    Backbone,
    Head,
    cpu_computes_bf16,
    default_num_threads,
    describe_objects,
    fingerprint_of,
    freeze,
    pick_device,
)
from fedprompt.worker.engine.results import EvalResult, TrainResult
from fedprompt.worker.engine.scoring import (
    phrase_embeddings,
    pooled_scores,
    resolve_scoring,
    word_average,
)
from fedprompt.worker.engine.template import Template, TextPair, Verbalizer
from torch import nn
from torch.nn import functional as F

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int, float], None]


def local_optimizer(name: str, params: list[nn.Parameter], *, lr: float, weight_decay: float = 0.0) -> Any:
    """A fresh optimiser of one call's local steps: AdamW (each element's step rescaled to about lr), or
    plain SGD (steps in proportion to the gradient; no momentum, so one call's steps carry no state)."""
    if name == LocalOptimizer.ADAMW:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == LocalOptimizer.SGD:
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown local optimiser {name!r}; expected one of {[o.value for o in LocalOptimizer]}")


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
        method: Method = Method.PROMPT_TUNING,
        encoder_type: EncoderType = EncoderType.MLP,
        encoder_hidden_size: int | None = None,
        encoder_num_layers: int = 2,
        prefix_projection: bool = False,
        scoring: Scoring = Scoring.AUTO,
        precision: Precision = "auto",
    ) -> None:
        if num_virtual_tokens < 1:
            raise ValueError(f"num_virtual_tokens must be >= 1; got {num_virtual_tokens}")
        self.device = pick_device(device)
        check_precision(precision)
        # bf16 autocast: on CUDA by default; on a CPU only when asked
        self.precision = (
            "bf16" if precision == "bf16" or (precision == "auto" and self.device.type == "cuda") else "fp32"
        )
        if self.device.type == "cpu":
            torch.set_num_threads(num_threads or default_num_threads())
            if self.precision == "bf16" and cpu_computes_bf16() is False:
                log.warning(
                    "precision bf16 on a CPU without AVX512-BF16 or AMX: bfloat16 is emulated here, "
                    "and a step takes many times as long as in fp32; use precision fp32 (or auto) "
                    "on this machine"
                )
        self.tokenizer = tokenizer
        self.family = backbone.family
        self._adapter = adapter(backbone.family)  # what differs by model family (worker/engine/families/)
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
        check_positions(backbone.config, num_virtual_tokens, max_length)
        freeze(backbone, self.device)
        _, num_layers, self.num_attention_heads = model_shape(backbone.config)
        self.method_config = MethodConfig(
            method=method,
            num_virtual_tokens=num_virtual_tokens,
            hidden_size=self.hidden_size,
            num_layers=num_layers,
            kv_size=kv_size(backbone.config),
            encoder_type=encoder_type,
            encoder_hidden_size=encoder_hidden_size,
            encoder_num_layers=encoder_num_layers,
            prefix_projection=prefix_projection,
        )
        self.method = method
        self._peft, self._encoder, self._params = attach(
            backbone, self.method_config, seed=seed, device=self.device
        )
        initialise(
            self._params,
            self.prompt,
            self.method_config,
            init=init,
            init_std=init_std,
            seed=seed,
            embeddings=backbone.input_embeddings.weight.detach(),
            tokenizer=tokenizer,
            verbalizer=self.verbalizer,
        )
        self._word_ids = torch.tensor(self.verbalizer.word_ids, dtype=torch.long, device=self.device)
        self._average = word_average(self.verbalizer).to(self.device)
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

    @classmethod
    def load(
        cls, model: str, *, template: str, verbalizer: Sequence[Sequence[str]], **options: Any
    ) -> PromptEngine:
        """Load a PLM by hub id or local path ('all-MiniLM-L6-v2' → the offline package) and wrap it.

        ``options`` are the constructor's keywords (num_virtual_tokens, max_length, init, init_std, seed,
        device, num_threads, the method options and scoring).
        """
        backbone, tokenizer, description = load_pretrained(model)
        return cls(
            backbone,
            tokenizer,
            template=template,
            verbalizer=verbalizer,
            fingerprint=fingerprint_of(description),
            description=description,
            **options,
        )

    @classmethod
    def from_spec(
        cls, spec: FederationSpec, *, device: str = "auto", num_threads: int | None = None
    ) -> PromptEngine:
        """The engine a federation's spec describes: its model, template, verbalizer and prompt method."""
        return cls.load(spec.model, device=device, num_threads=num_threads, **spec_options(spec))

    @classmethod
    def from_model(
        cls,
        model: PreTrainedModel,
        tokenizer: Any,
        *,
        template: str,
        verbalizer: Sequence[Sequence[str]],
        head: HeadChoice = "auto",
        **kwargs: Any,
    ) -> PromptEngine:
        """Wrap a built transformers model: a *ForMaskedLM or bare encoder, a causal LM, or a seq2seq LM."""
        backbone = backbone_of(model, head)
        description = describe_objects(model.config, tokenizer)
        kwargs.setdefault("fingerprint", fingerprint_of(description))
        kwargs.setdefault("description", description)
        return cls(backbone, tokenizer, template=template, verbalizer=verbalizer, **kwargs)

    # ------------------------------------------------------------------ forward

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _batch(self, examples: Sequence[TextPair]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        encoded = self.template.encode(examples)
        ids, mask = pad(encoded.input_ids, self._pad_id)
        positions = torch.tensor(encoded.mask_positions, dtype=torch.long)
        return ids.to(self.device), mask.to(self.device), positions.to(self.device)

    def _length_batches(
        self, examples: Sequence[TextPair], batch_size: int, rng: np.random.Generator, window: int
    ) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Endless training batches (example indices, token ids, attention mask, mask positions): the
        seeded order of `cycle_batches`, `window` batches at a time (fewer where the examples
        are fewer: a window spans at most one pass over them) encoded and regrouped by length
        (batching.length_batches), so little of each batch is padding."""
        order = cycle_batches(len(examples), batch_size, rng)
        size = min(batch_size, len(examples))
        per_window = max(1, min(window, len(examples) // size))
        while True:
            held = np.concatenate([next(order) for _ in range(per_window)])
            encoded = self.template.encode([examples[i] for i in held])
            for rows in length_batches([len(r) for r in encoded.input_ids], size, rng):
                ids, mask = pad([encoded.input_ids[r] for r in rows], self._pad_id)
                positions = torch.tensor([encoded.mask_positions[r] for r in rows], dtype=torch.long)
                yield held[rows], ids.to(self.device), mask.to(self.device), positions.to(self.device)

    def scores(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask_pos: torch.Tensor
    ) -> torch.Tensor:
        """Label scores [batch, num_labels] for encoded inputs, through the prompt method."""
        batch = input_ids.shape[0]
        rows = torch.arange(batch, device=input_ids.device)
        # Prompt tuning and P-tuning prepend virtual tokens; prefixes sit in the attention cache instead.
        at = mask_pos + (0 if self.method == Method.PREFIX_TUNING else self.num_virtual_tokens)
        bb = self._backbone
        out = self._peft(
            input_ids=input_ids, attention_mask=attention_mask, **self._adapter.model_inputs(bb, input_ids)
        )
        if self._label_embeddings is not None:
            return pooled_scores(out.last_hidden_state, attention_mask, self._label_embeddings)
        word_logits = self._adapter.word_logits(bb, out, rows, at, self._word_ids)
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
        optimizer: str = LocalOptimizer.ADAMW,
        seed: int = 0,
        weight_decay: float = 0.0,
        prox_mu: float = 0.0,
        correction: Mapping[str, np.ndarray] | None = None,
        mean_gradient: bool = False,
        balanced_tau: float = 0.0,
        progress: ProgressFn | None = None,
        length_window: int = LENGTH_WINDOW,
    ) -> TrainResult:
        """Run `steps` steps of `optimizer` (adamw, or sgd: plain gradient steps) on the method's tensors
        only (a fresh optimiser per call), seeded batches.

        Client-drift correction (shared/drift.py): `prox_mu` > 0 adds FedProx's proximal gradient
        μ·(w − w_start), w_start being the prompt as loaded (the round's global prompt); `correction`
        (SCAFFOLD's c − c_i, per communicated tensor) is added to every step's gradient; with
        `mean_gradient` the result carries the mean clipped loss gradient (SCAFFOLD's new c_i);
        `balanced_tau` > 0 adds τ·log(the examples' own label distribution) to the scores inside the
        loss (the logit-adjusted, balanced loss). Batches group examples of similar length within
        windows of `length_window` batches of the seeded order (1: the seeded random batches as
        they are)."""
        if not examples:
            raise ValueError("cannot train on an empty data set")
        if steps < 0:
            raise ValueError(f"steps must be >= 0; got {steps}")
        labels = label_ids(examples, self.verbalizer.num_labels)
        named = dict(self._params)
        params = list(named.values())
        step_rule = local_optimizer(optimizer, params, lr=lr, weight_decay=weight_decay)
        anchor = {n: p.detach().clone() for n, p in named.items()} if prox_mu > 0 else {}
        extra = (
            {
                n: torch.as_tensor(np.asarray(correction[n]), dtype=p.dtype, device=p.device)
                for n, p in named.items()
            }
            if correction is not None
            else {}
        )
        grad_sum = (
            {n: torch.zeros_like(p, dtype=torch.float64) for n, p in named.items()} if mean_gradient else {}
        )
        adjust = None
        if balanced_tau > 0:
            counts = torch.bincount(labels, minlength=self.verbalizer.num_labels).tolist()
            shift = drift.logit_adjustment(drift.label_prior(counts), balanced_tau)
            adjust = torch.as_tensor(shift, dtype=torch.float32, device=self.device)
        batches = self._length_batches(
            examples, batch_size, np.random.default_rng([seed, 0xBA]), max(1, length_window)
        )
        started = time.perf_counter()
        losses: list[float] = []
        for step in range(1, steps + 1):
            idx, ids, mask, pos = next(batches)
            target = labels[torch.as_tensor(idx)].to(self.device)
            with self._autocast():
                scores = self.scores(ids, mask, pos)
            logits = scores.float() if adjust is None else scores.float() + adjust
            loss = F.cross_entropy(logits, target)  # the loss in float32 under bf16 autocast
            step_rule.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            if grad_sum or anchor or extra:
                with torch.no_grad():
                    for n, p in named.items():
                        if p.grad is None:
                            continue
                        if grad_sum:
                            grad_sum[n] += p.grad.double()
                        p.grad.copy_(
                            drift.corrected_gradient(p.grad, p, anchor.get(n), prox_mu, extra.get(n))
                        )
            step_rule.step()
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(
                    f"training loss became {value} at step {step}; lower the learning rate"
                )
            losses.append(value)
            if progress is not None:
                progress(step, steps, value)
        return TrainResult.from_losses(
            losses,
            seconds=time.perf_counter() - started,
            num_examples=len(examples),
            mean_gradient={n: (g / max(steps, 1)).cpu().numpy() for n, g in grad_sum.items()} or None,
        )

    @torch.inference_mode()
    def evaluate(self, examples: Sequence[TextPair | Any], *, batch_size: int = 64) -> EvalResult:
        """Accuracy, mean cross-entropy and per-class counts of the current prompt on labelled examples."""
        started = time.perf_counter()
        k = self.verbalizer.num_labels
        confusion = np.zeros((k, k), dtype=np.int64)
        if not examples:
            return EvalResult.from_confusion(confusion, 0.0, 0.0)
        labels = label_ids(examples, self.verbalizer.num_labels)
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
                scores = self.scores(ids.to(self.device), mask.to(self.device), pos.to(self.device))
            scores = scores.float().cpu()
            total_loss += float(F.cross_entropy(scores, target, reduction="sum"))
            np.add.at(confusion, (target.numpy(), scores.argmax(dim=1).numpy()), 1)
        return EvalResult.from_confusion(confusion, total_loss, time.perf_counter() - started)

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
        return self._adapter.count_parameters(self._backbone.config)

    def get_prompt(self) -> dict[str, np.ndarray]:
        """A float32 copy of the trainable tensors, keyed by their wire names."""
        return prompt_io.read(self._params)

    def set_prompt(self, tensors: Mapping[str, np.ndarray | torch.Tensor]) -> None:
        """Replace the method's tensors; names and shapes must match exactly and values must be finite."""
        context = f"method={self.method}, num_virtual_tokens={self.num_virtual_tokens}, hidden_size={self.hidden_size}"
        prompt_io.write(self._params, prompt_io.checked(tensors, self.tensor_shapes(), context))

    def save_prompt(self, metadata: Mapping[str, Any] | None = None) -> bytes:
        """The prompt as safetensors bytes (shared.wire format) with the caller's metadata."""
        return wire.encode(self.get_prompt(), metadata)

    def load_prompt(self, data: bytes, *, check_fingerprint: bool = False) -> dict[str, str]:
        """Set the prompt from safetensors bytes and return their metadata."""
        tensors, meta = prompt_io.decode(data, self.fingerprint if check_fingerprint else None)
        self.set_prompt(tensors)
        return meta
