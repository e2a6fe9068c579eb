"""The client's side of drift correction: what the spec's `drift_correction` asks of its local steps
(FedProx's μ, the balanced loss's τ, SCAFFOLD's c − c_i) and of its update (entropy scaling). The
rules themselves are shared/drift.py's; this module reads them off the spec and the client's data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from fedprompt.shared import drift
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.spec_options import DriftCorrectionSpec


def train_options(
    drift_spec: DriftCorrectionSpec | None,
    server_control: Mapping[str, np.ndarray] | None,
    own_control: Mapping[str, np.ndarray] | None,
) -> dict[str, Any]:
    """The engine's keyword arguments for the local steps, only those the spec asks for."""
    options: dict[str, Any] = {}
    if drift_spec is not None and drift_spec.prox_mu > 0:
        options["prox_mu"] = drift_spec.prox_mu
    if drift_spec is not None and drift_spec.balanced_loss and drift_spec.tau > 0:
        options["balanced_tau"] = drift_spec.tau
    if server_control is not None and own_control is not None:
        options["correction"] = drift.scaffold_correction(server_control, own_control)
        options["mean_gradient"] = True
    return options


def update_scale(spec: FederationSpec | None, examples: Sequence[Any]) -> float | None:
    """Entropy scaling's factor for this client's update, from its own label counts (which stay
    here); None when the spec does not ask for it or the labels are balanced (nothing to scale)."""
    if spec is None or spec.drift_correction is None or not spec.drift_correction.entropy_scaling:
        return None
    counts = np.bincount([int(ex.label) for ex in examples], minlength=len(spec.verbalizer))
    scale = drift.label_entropy_share(counts.tolist())
    return None if scale >= 1.0 - 1e-9 else scale
