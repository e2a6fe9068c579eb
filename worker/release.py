"""What leaves the worker after training: the evaluation report of a global prompt, and the update's
release — entropy scaling, a malicious worker's own measurements and attack, then local DP, each when
the spec or the worker's configuration asks for it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from fedprompt.shared.drift import scaled_update
from fedprompt.shared.evalstats import confusion_metrics
from fedprompt.shared.privacy import gaussian_ldp, gaussian_noise_multiplier, laplace_ldp, ldp_rng
from fedprompt.shared.spec_options import PrivacySpec
from fedprompt.worker.poison import Backdoor


def evaluation_report(result: Any, asr: Any | None) -> dict[str, Any]:
    """The report of one evaluation: accuracy and loss, the confusion counts (the coordinator sums
    them into per-class accuracy and macro-F1) and, when measured, the ASR with its sample count."""
    report: dict[str, Any] = {"num_samples": result.n, "accuracy": result.accuracy, "loss": result.loss}
    metrics: dict[str, float] = dict(confusion_metrics(getattr(result, "confusion", None) or []))
    if asr is not None:
        # the coordinator weights ASR by its own sample count (non-target examples only)
        metrics |= {"asr": asr.accuracy, "asr_samples": asr.n}
    if metrics:
        report["metrics"] = metrics
    return report


def release(
    trained: dict[str, np.ndarray],
    global_prompt: Mapping[str, np.ndarray],
    metrics: dict[str, Any],
    *,
    backdoor: Backdoor | None,
    privacy: PrivacySpec | None,
    evaluate: Callable[[Sequence[Any]], Any],
    asr_data: Sequence[Any],
    eval_data: Sequence[Any],
    ldp_seed: int | None,
    round_number: int,
    update_scale: float | None = None,
) -> dict[str, np.ndarray]:
    """The trained prompt as it is uploaded; what the worker measured or applied goes into `metrics`.
    `update_scale` (entropy scaling, shared/drift.py) shrinks an honest client's update first, so that
    local DP clips and noises what is sent; a malicious worker sends its attack unscaled."""
    malicious = backdoor is not None and backdoor.malicious
    if update_scale is not None and not malicious:  # not in `metrics`: those go up with the update
        trained = scaled_update(trained, global_prompt, update_scale)
    if malicious:
        assert backdoor is not None
        # its own prompt before any attack: the backdoor (local ASR) and the clean task (local accuracy)
        if asr_data:
            metrics["local_asr"] = evaluate(asr_data).accuracy
        if eval_data:
            metrics["local_accuracy"] = evaluate(eval_data).accuracy
        trained = backdoor.manipulate(trained, global_prompt)
    if privacy is not None:
        # OS entropy unless seeded (simulations): noise from a seed someone else knows could be subtracted
        rng = ldp_rng(ldp_seed, round_number)
        if privacy.mechanism == "gaussian":
            assert privacy.delta is not None  # the spec refuses gaussian without delta
            sigma = gaussian_noise_multiplier(privacy.epsilon, privacy.delta)
            trained = gaussian_ldp(
                trained, global_prompt, bound=privacy.clip, noise_multiplier=sigma, rng=rng
            )
            metrics["noise_multiplier"] = sigma
        else:
            trained = laplace_ldp(
                trained, global_prompt, bound=privacy.clip, epsilon=privacy.epsilon, rng=rng
            )
        metrics["epsilon"] = privacy.epsilon
    return trained
