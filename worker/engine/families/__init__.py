"""Model families: one adapter per family (masked_lm, causal_lm, seq2seq, …) owns what differs between them
(see base.py). Every module of this package is imported here, so a module that registers an adapter is
all a new family needs on the worker."""

from __future__ import annotations

import importlib
import pkgutil

from fedprompt.worker.engine.families.base import (
    FamilyAdapter,
    LanguageModelAdapter,
    ScoreReading,
    adapter,
    detect,
    register,
    registry,
    unregister,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "FamilyAdapter",
    "LanguageModelAdapter",
    "ScoreReading",
    "adapter",
    "detect",
    "register",
    "registry",
    "unregister",
]
