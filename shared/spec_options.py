"""The options a federation spec composes, each its own validated model: the aggregation rule, local
differential privacy, secure aggregation (and the conditions it needs), the server optimiser and
client-drift correction. FederationSpec (shared/spec.py) holds one of each and checks how they combine."""

from __future__ import annotations

from typing import Annotated, Literal

from fedprompt.shared.vocab import (
    SERVER_OPTIMIZER_DEFAULTS,
    AggregationRule,
    ByText,
    DriftCorrection,
    ServerOptimizer,
)
from pydantic import BaseModel, ConfigDict, Field, model_validator

DriftCorrectionName = Annotated[DriftCorrection, ByText()]
# the optimisers with defaults in SERVER_OPTIMIZER_DEFAULTS, each with its update rule in
# coordinator/logic/server_optim.py (tests/coordinator/test_vocab_registries.py checks both)
ServerOptimizerName = Annotated[ServerOptimizer, ByText(SERVER_OPTIMIZER_DEFAULTS)]


class AggregationSpec(BaseModel):
    """A named aggregation rule and its parameters."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(AggregationRule.FEDAVG, description="Registered aggregation rule, e.g. 'fedavg'.")
    params: dict[str, float | int | str] = Field(default_factory=dict)


class PrivacySpec(BaseModel):
    """Local differential privacy applied by every client to its update before upload."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    mechanism: Literal["laplace", "gaussian"] = Field(
        "laplace",
        description="laplace: clip the update's L1 norm to `clip`, add Laplace(2·clip/epsilon) noise (ε-DP: "
        "two clipped updates differ by up to 2·clip); gaussian: clip its L2 norm to `clip`, add "
        "N(0, (σ·2·clip)²) noise with σ calibrated by the PRV accountant for (epsilon, delta)-DP.",
    )
    epsilon: float = Field(..., gt=0, le=1e6, description="Privacy budget of one round's update.")
    delta: float | None = Field(
        None, ge=1e-10, le=0.1, description="Gaussian only: the δ of each round's (ε, δ) guarantee."
    )
    clip: float = Field(
        ...,
        gt=0,
        le=1e6,
        description="Norm bound of an update (new - global prompt): L1 for laplace, L2 for gaussian.",
    )

    @model_validator(mode="after")
    def _check(self) -> PrivacySpec:
        if self.mechanism == "gaussian":
            if self.delta is None:
                raise ValueError(
                    "the gaussian mechanism needs delta, e.g. 1e-5 (below 1 / the number of examples)"
                )
            if not 0.05 <= self.epsilon <= 100:
                raise ValueError(
                    f"the gaussian mechanism takes epsilon in [0.05, 100] per round; got {self.epsilon}"
                )
        elif self.delta is not None:
            raise ValueError(
                "delta applies to the gaussian mechanism only; the laplace mechanism is pure ε-DP"
            )
        return self


class SecureAggregationSpec(BaseModel):
    """Secure aggregation (SecAgg+): the coordinator learns the weighted mean of the round's updates and
    not any one of them (docs/secure-aggregation.md)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    threshold: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="t as a fraction of a client's neighbourhood k: a client's secrets are reconstructed from "
        "t = floor(threshold·k) + 1 of its neighbours' shares, and a round needs t clients through every stage.",
    )
    neighbours: int | None = Field(
        None,
        ge=2,
        le=1000,
        description="k, the neighbours each client exchanges keys and shares with (default 2·ceil(log2 n), "
        "at most n − 1).",
    )
    clip: float = Field(
        1.0,
        gt=0,
        le=1e6,
        description="Each element of an update (new − global prompt) is clipped to [−clip, clip] before it is "
        "quantised.",
    )
    bits: int = Field(
        20,
        ge=8,
        le=32,
        description="Quantisation levels 2^bits over [−clip, clip]: the mean is within clip / (2^bits − 1) of "
        "FedAvg's, per element.",
    )
    stage_deadline_s: float = Field(
        60.0,
        gt=0,
        le=86400,
        description="Deadline of the key, share and unmasking stages (the masked upload has round_deadline_s).",
    )
    report_confusion: bool = Field(
        False,
        description="Whether clients send their evaluation confusion matrix (their label mix and errors per "
        "class) in evaluation reports; off, reports leave the per-class counts out.",
    )


class ServerOptimizerSpec(BaseModel):
    """A server-side optimiser applied to each round's aggregate (Reddi et al., ICLR 2021).

    The pseudo-gradient Δ = aggregate − previous global prompt is the optimiser's step direction;
    its state (momentum, second moments) is kept in the database from round to round. Unset
    hyper-parameters take the optimiser's defaults (SERVER_OPTIMIZER_DEFAULTS, shared/vocab.py), and the
    stored spec records the values used. Update rules: coordinator/logic/server_optim.py.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    name: ServerOptimizerName = Field(
        ...,
        description="fedavg: the aggregate is the next prompt (no server optimiser, the same as null); "
        "fedavgm: m = momentum·m + Δ, x += lr·m; fedadagrad / fedadam / fedyogi: adaptive steps "
        "x += lr·m / (√v + tau) with m = beta1·m + (1 − beta1)·Δ and v the optimiser's second moment "
        "(fedadam's step size bias-corrected, as Flower's FedAdam).",
    )
    lr: float | None = Field(
        None,
        gt=0,
        le=100,
        description="η, the server learning rate (default: fedavgm 1.0, fedadagrad and fedadam 0.1, fedyogi 0.01).",
    )
    momentum: float | None = Field(
        None, ge=0, lt=1, description="fedavgm only: the momentum β of m = β·m + Δ (default 0.9)."
    )
    beta1: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="fedadagrad, fedadam, fedyogi: decay of the first moment m (default 0.9; fedadagrad 0).",
    )
    beta2: float | None = Field(
        None, ge=0, lt=1, description="fedadam, fedyogi: decay of the second moment v (default 0.99)."
    )
    tau: float | None = Field(
        None,
        gt=0,
        le=10,
        description="fedadagrad, fedadam, fedyogi: added to √v, bounds the step per element (default 1e-3).",
    )

    @model_validator(mode="after")
    def _check(self) -> ServerOptimizerSpec:
        takes = SERVER_OPTIMIZER_DEFAULTS[self.name]
        given = [key for key in ("lr", "momentum", "beta1", "beta2", "tau") if getattr(self, key) is not None]
        extra = [key for key in given if key not in takes]
        if extra:
            if self.name == ServerOptimizer.FEDAVG:
                raise ValueError(
                    f"fedavg takes no server hyper-parameters (the aggregate is the next prompt); "
                    f"remove {extra}, or choose fedavgm for a server learning rate and momentum"
                )
            hint = ""
            if "momentum" in extra:
                hint = " (the adaptive optimisers' momentum is beta1)"
            elif "beta2" in extra and self.name == ServerOptimizer.FEDADAGRAD:
                hint = " (fedadagrad's second moment is a plain sum, v = v + Δ²)"
            raise ValueError(f"{self.name} takes {list(takes)}, not {extra}{hint}")
        for key, value in takes.items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        return self

    def params(self) -> dict[str, float]:
        """The optimiser's hyper-parameters, every one it takes (defaults filled in)."""
        return {key: getattr(self, key) for key in SERVER_OPTIMIZER_DEFAULTS[self.name]}


class DriftCorrectionSpec(BaseModel):
    """Client-drift correction of the local steps (label skew pulls each client's prompt towards its
    own optimum). Update rules: shared/drift.py."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    name: DriftCorrectionName = Field(
        DriftCorrection.NONE,
        description="none: plain local steps; fedprox: the proximal term "
        "(mu/2)·‖w − w_t‖² pulls the local prompt towards the round's global prompt; scaffold: each "
        "local gradient is corrected by c − c_i, the server's control variate minus the client's own "
        "(the server's travels with the train task, each client's Δc_i with its update).",
    )
    mu: float | None = Field(
        None, ge=0, le=100, description="fedprox only: the proximal term's weight μ (default 0.01)."
    )
    balanced_loss: bool = Field(
        False,
        description="Logit-adjusted local loss: each client adds τ·log(its own label distribution) to "
        "the label scores inside its training loss (never to predictions), so a client holding mostly "
        "one label does not pull the shared prompt towards calling everything that label. Combines "
        "with none, fedprox or scaffold; the distribution stays on the client.",
    )
    tau: float = Field(1.0, ge=0, le=10, description="balanced_loss: the adjustment's weight τ.")
    entropy_scaling: bool = Field(
        False,
        description="Each client sends its update (its trained prompt minus the round's global prompt) "
        "scaled by the entropy of its own label distribution over log(labels), in [0, 1]: a client "
        "holding one label sends none of it, one holding every label equally all of it. Combines with the others; the distribution stays on the client.",
    )

    @model_validator(mode="after")
    def _check(self) -> DriftCorrectionSpec:
        if self.name != DriftCorrection.FEDPROX and self.mu is not None:
            raise ValueError(f"mu is FedProx's proximal weight; {self.name} takes no mu")
        if self.name == DriftCorrection.FEDPROX and self.mu is None:
            self.mu = 0.01
        if not self.balanced_loss and self.tau != 1.0:  # a stored spec repeats the default
            raise ValueError("tau is the balanced loss's weight; set balanced_loss: true to use it")
        return self

    @property
    def prox_mu(self) -> float:
        """μ of the proximal term (0 unless fedprox)."""
        return float(self.mu or 0.0) if self.name == DriftCorrection.FEDPROX else 0.0

    @property
    def scaffold(self) -> bool:
        return self.name == DriftCorrection.SCAFFOLD


def label_skew_default() -> DriftCorrectionSpec:
    """The default drift correction: the balanced local loss with entropy scaling, chosen from the
    label-skew grid (RESULTS.md, "Label skew"). Without skew it changes next to nothing: every
    client's labels are near balanced, so the loss's shift is near constant and the scale near 1."""
    return DriftCorrectionSpec(balanced_loss=True, entropy_scaling=True)


SECURE_AGGREGATION_MIN_CLIENTS = 3  # with two, each could subtract its own update from the mean


def check_secure_aggregation(
    rule: str,
    clients: int,
    *,
    option: str = "secure_aggregation",
    rule_option: str = "the {} rule",
    clients_option: str = "min_clients",
) -> None:
    """Secure aggregation's conditions, for a spec and for `fedprompt simulate`'s options: the fedavg
    aggregation rule and at least 3 clients. ValueError otherwise, naming the spec's fields, or the
    caller's (`rule_option` formats the rule's name)."""
    if rule != AggregationRule.FEDAVG:
        raise ValueError(
            f"{option} cannot be combined with {rule_option.format(rule)}: the coordinator sees only the "
            "sum of the masked updates, and a robust rule needs each update; use fedavg (optionally with "
            f"a server optimiser) or drop {option}"
        )
    if clients < SECURE_AGGREGATION_MIN_CLIENTS:
        raise ValueError(
            f"{option} needs {clients_option} of at least {SECURE_AGGREGATION_MIN_CLIENTS}: with two "
            "clients each could subtract its own update from the mean and learn the other's"
        )
