"""The frozen PLM as the engine holds it (a Backbone), freezing, fingerprinting and the device; each model
family loads its models in worker/engine/families/."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
from fedprompt.shared.local import cpu_flags
from fedprompt.shared.vocab import Family
from fedprompt.worker.data.pack import sha256_file
from fedprompt.worker.engine.offline import resolve_model
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Files that define what a token id means; any change to them changes the fingerprint.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "added_tokens.json",
)

# How a backbone reads label words: the MLM head, the tied input embeddings, or the whole LM's logits.
Head = Literal["mlm", "tied-embeddings", "lm"]
# What a caller may ask of a built masked LM (families/masked_lm.py): its head, or the tied embeddings.
HeadChoice = Literal["auto", "mlm", "tied-embeddings"]


class ModelError(ValueError):
    """The model cannot be used for prompt tuning with a verbalizer (e.g. it has no mask token)."""


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' logging at errors only, while a model loads."""
    # The load report lists the MLM head of MiniLM as MISSING; we detect that ourselves and say so.
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)


@dataclass
class Backbone:
    """A loaded PLM split into the encoder we run and the way label words are scored."""

    encoder: nn.Module
    head: Head
    mlm_head: nn.Module | None
    full_model: nn.Module | None
    input_embeddings: nn.Embedding
    config: Any
    family: str = Family.MASKED_LM  # a registered family's name (worker/engine/families/)

    @property
    def runner(self) -> nn.Module:
        """The module the prompt method wraps and runs: the whole model when it has no separable head."""
        return self.full_model if self.full_model is not None else self.encoder


def input_embeddings_of(model: PreTrainedModel) -> nn.Embedding:
    """The model's token embedding table. transformers annotates get_input_embeddings() as any Module;
    the language models of every family here return an nn.Embedding (or a subclass: BART's is scaled)."""
    return cast(nn.Embedding, model.get_input_embeddings())


def _model_file(path: str, filename: str) -> Path | None:
    """A file of a local model folder or of a hub model in the local cache; None when it does not exist."""
    local = Path(path)
    if local.is_dir():
        candidate = local / filename
        return candidate if candidate.is_file() else None
    try:
        from transformers.utils import cached_file

        found = cached_file(
            path,
            filename,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
        )
    except (OSError, ValueError):
        return None
    return Path(found) if found else None


def describe_config(config: Any, file_hashes: dict[str, str]) -> dict[str, Any]:
    """The fields the fingerprint is made of, from a transformers config plus file hashes."""
    architectures = getattr(config, "architectures", None) or [config.model_type]
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return {
        "architecture": architectures[0],
        "model_type": config.model_type,
        "hidden_size": int(getattr(text_config, "hidden_size", 0) or getattr(text_config, "d_model", 0)),
        "num_layers": int(
            getattr(text_config, "num_hidden_layers", 0) or getattr(text_config, "num_layers", 0)
        ),
        "vocab_size": int(getattr(text_config, "vocab_size", 0)),
        "files": dict(sorted(file_hashes.items())),
    }


def describe_model(model_name_or_path: str) -> dict[str, Any]:
    """Architecture, hidden size, layers, vocab size and sha256 of config.json and tokenizer files."""
    from transformers import AutoConfig

    path = resolve_model(model_name_or_path)
    config = AutoConfig.from_pretrained(path)
    hashes: dict[str, str] = {}
    for filename in ("config.json", *TOKENIZER_FILES):
        found = _model_file(path, filename)
        if found is not None:
            hashes[filename] = sha256_file(found)
    if "config.json" not in hashes:
        hashes["config.json"] = hashlib.sha256(config.to_json_string(use_diff=False).encode()).hexdigest()
    return describe_config(config, hashes)


def fingerprint_of(description: dict[str, Any]) -> str:
    """A short stable hash (16 hex digits) of a model description."""
    canonical = json.dumps(description, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def model_fingerprint(model_name_or_path: str) -> str:
    """Short stable hash of a model's architecture, sizes, config.json and tokenizer files."""
    return fingerprint_of(describe_model(model_name_or_path))


def describe_objects(config: Any, tokenizer: Any) -> dict[str, Any]:
    """Describe an in-memory model + tokenizer (no files): hashes of the config JSON and the vocabulary."""
    config_json = config.to_json_string(use_diff=False)
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), separators=(",", ":"))
    return describe_config(
        config,
        {
            "config.json": hashlib.sha256(config_json.encode()).hexdigest(),
            "vocab": hashlib.sha256(vocab.encode()).hexdigest(),
        },
    )


def freeze(backbone: Backbone, device: torch.device) -> None:
    """Freeze the PLM's modules and move them to the device."""
    for module in (backbone.encoder, backbone.mlm_head, backbone.full_model):
        if module is not None:
            module.requires_grad_(False)
            # Dropout off: the PLM is frozen and a fixed forward makes training reproducible.
            module.eval()
            module.to(device)


def pick_device(device: str) -> torch.device:
    """'auto' → CUDA when available, else CPU; 'cpu' / 'cuda' / 'cuda:N' as asked."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available")
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda'; got {device!r}")
    return torch.device(device)


CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_computes_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether every core computes bfloat16 natively (AVX512-BF16 or AMX), from /proc/cpuinfo's
    flags (or `cpuinfo`'s, as given); None where they cannot be read (not Linux). Without them, bf16
    autocast on a CPU is emulated and far slower than fp32."""
    flags = cpu_flags(cpuinfo)
    return None if flags is None else bool(flags & CPU_BF16_FLAGS)


def default_num_threads() -> int:
    """CPU threads for torch: the cores this process may run on, never more than torch's own default."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        available = os.cpu_count() or 1
    return max(1, min(available, torch.get_num_threads()))
