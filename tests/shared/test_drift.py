"""FedProx's proximal term and SCAFFOLD's control variates (shared/drift.py) against hand-computed
arrays, and the spec's drift_correction options."""

from __future__ import annotations

import numpy as np
import pytest
from fedprompt.shared import drift
from fedprompt.shared.spec import FederationSpec
from pydantic import ValidationError

G = np.array([[0.5, -1.0], [2.0, 0.0]])
W = np.array([[1.0, 1.0], [0.0, -2.0]])
W_T = np.array([[0.0, 2.0], [0.0, 0.0]])


def test_the_proximal_term_adds_mu_times_the_distance_from_the_global_prompt() -> None:
    got = drift.corrected_gradient(G, W, W_T, mu=0.1)
    # g + 0.1·(w − w_t) = [[0.5 + 0.1, −1 − 0.1], [2 + 0, 0 − 0.2]]
    np.testing.assert_allclose(got, [[0.6, -1.1], [2.0, -0.2]])
    np.testing.assert_array_equal(drift.corrected_gradient(G, W, W_T, mu=0.0), G)  # FedAvg's step
    with pytest.raises(drift.DriftError, match="anchor"):
        drift.corrected_gradient(G, W, None, mu=0.1)
    with pytest.raises(drift.DriftError, match=">= 0"):
        drift.corrected_gradient(G, W, W_T, mu=-1.0)


def test_scaffold_corrects_each_gradient_by_c_minus_c_i() -> None:
    c = {"p": np.array([0.25, -0.5])}
    c_i = {"p": np.array([1.0, 0.5])}
    correction = drift.scaffold_correction(c, c_i)
    np.testing.assert_allclose(correction["p"], [-0.75, -1.0])
    got = drift.corrected_gradient(np.array([1.0, 1.0]), np.zeros(2), correction=correction["p"])
    np.testing.assert_allclose(got, [0.25, 0.0])
    # both at once: g + μ(w − w_t) + (c − c_i)
    both = drift.corrected_gradient(
        np.array([1.0, 1.0]), np.array([2.0, 0.0]), np.zeros(2), 0.5, correction["p"]
    )
    np.testing.assert_allclose(both, [1.25, 0.0])


def test_the_client_control_variate_is_its_mean_gradient_and_the_change_is_uploaded() -> None:
    new, delta = drift.client_control({"p": np.array([0.2, 0.4])}, {"p": np.array([0.5, 0.0])})
    np.testing.assert_allclose(new["p"], [0.2, 0.4])
    np.testing.assert_allclose(delta["p"], [-0.3, 0.4])
    with pytest.raises(drift.DriftError, match="name different tensors"):
        drift.client_control({"p": np.zeros(2)}, {"q": np.zeros(2)})


def test_option_ii_with_sgd_is_the_mean_gradient() -> None:
    """Karimireddy et al.'s option II, c_i⁺ = c_i − c + (x − y)/(K·η), for K plain SGD steps with the
    corrected gradient, equals the mean of the uncorrected gradients (what client_control takes)."""
    rng = np.random.default_rng(0)
    c, c_i, x = rng.normal(size=3), rng.normal(size=3), rng.normal(size=3)
    grads = rng.normal(size=(5, 3))
    lr, y = 0.1, x.copy()
    for g in grads:
        y = y - lr * drift.corrected_gradient(g, y, correction=c - c_i)
    option_ii = c_i - c + (x - y) / (len(grads) * lr)
    new, _ = drift.client_control({"p": grads.mean(axis=0)}, {"p": c_i})
    np.testing.assert_allclose(new["p"], option_ii)


def test_the_server_control_variate_moves_by_the_sum_of_changes_over_the_enrolled() -> None:
    c = {"p": np.array([1.0, 0.0])}
    deltas = [{"p": np.array([0.3, 0.6])}, {"p": np.array([0.9, -0.3])}]
    # c + (|S|/N)·mean(Δc) with |S| = 2, N = 3: c + (0.3 + 0.9, 0.6 − 0.3) / 3
    np.testing.assert_allclose(drift.server_control(c, deltas, enrolled=3)["p"], [1.4, 0.1])
    np.testing.assert_allclose(drift.server_control(c, [], enrolled=3)["p"], [1.0, 0.0])
    with pytest.raises(drift.DriftError, match="2 control-variate updates from 1"):
        drift.server_control(c, deltas, enrolled=1)
    with pytest.raises(drift.DriftError, match="shapes"):
        drift.server_control(c, [{"p": np.zeros(3)}], enrolled=3)
    with pytest.raises(drift.DriftError, match="non-finite"):
        drift.server_control(c, [{"p": np.array([np.inf, 0.0])}], enrolled=3)


def test_control_tensors_travel_under_their_prefix() -> None:
    prompt, control = drift.split({"a": 1, "control/a": 2})
    assert prompt == {"a": 1} and control == {"a": 2}
    assert drift.prefixed({"a": 2}) == {"control/a": 2}
    assert drift.zeros({"a": (2, 1)})["a"].tolist() == [[0.0], [0.0]]


def test_the_spec_takes_fedprox_and_scaffold_and_refuses_what_they_cannot_combine_with() -> None:
    prox = FederationSpec(drift_correction={"name": "fedprox"})
    assert prox.drift_correction is not None and prox.drift_correction.prox_mu == 0.01
    assert prox.update_shapes() == prox.tensor_shapes()
    scaffold = FederationSpec(drift_correction={"name": "scaffold"})
    assert scaffold.scaffold and scaffold.update_shapes() == {
        "prompt_embeddings": (20, 384),
        "control/prompt_embeddings": (20, 384),
    }
    with pytest.raises(ValidationError, match="takes no mu"):
        FederationSpec(drift_correction={"name": "scaffold", "mu": 0.1})
    for clash, words in (
        ({"aggregation": {"name": "median"}}, "median rule"),
        ({"privacy": {"epsilon": 1.0, "clip": 1.0}}, "local DP"),
    ):
        with pytest.raises(ValidationError, match=words):
            FederationSpec(drift_correction={"name": "scaffold"}, **clash)
    FederationSpec(drift_correction={"name": "fedprox", "mu": 0.5}, aggregation={"name": "median"})


def test_the_balanced_loss_shifts_scores_by_the_log_of_the_clients_own_label_mix() -> None:
    prior = drift.label_prior([97, 1])  # add-one: (98, 2) / 100
    np.testing.assert_allclose(prior, [0.98, 0.02])
    np.testing.assert_allclose(drift.label_prior([0, 0, 2]), [0.2, 0.2, 0.6])
    shift = drift.logit_adjustment(prior, tau=1.0)
    np.testing.assert_allclose(shift, [np.log(0.98), np.log(0.02)])
    np.testing.assert_allclose(drift.logit_adjustment(prior, tau=0.5), 0.5 * shift)
    # the client's majority label starts almost "free": scores (0, 0) already give it
    # p = 0.98, so calling everything that label earns it little; the minority label costs more
    logits = np.zeros(2) + shift
    p = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(p, prior)
    with pytest.raises(drift.DriftError, match="non-negative"):
        drift.label_prior([-1, 3])
    with pytest.raises(drift.DriftError, match="tau"):
        drift.logit_adjustment(prior, tau=-1)
    spec = FederationSpec(drift_correction={"name": "fedprox", "balanced_loss": True, "tau": 0.5})
    assert spec.drift_correction is not None and spec.drift_correction.balanced_loss
    with pytest.raises(ValidationError, match="set balanced_loss"):
        FederationSpec(drift_correction={"name": "none", "tau": 0.5})


def test_entropy_scaling_shrinks_an_update_by_the_clients_own_label_entropy() -> None:
    # (411, 32): p = (411, 32) / 443, entropy 0.2594 nats over log 2
    p = np.array([411, 32]) / 443
    expected = float(-(p * np.log(p)).sum() / np.log(2))
    assert drift.label_entropy_share([411, 32]) == pytest.approx(expected) == pytest.approx(0.3742, abs=1e-4)
    assert drift.label_entropy_share([158, 0]) == 0.0  # one label: nothing to send
    with pytest.raises(drift.DriftError, match="two labels"):
        drift.label_entropy_share([0, 0])
    assert drift.label_entropy_share([50, 50]) == pytest.approx(1.0)
    assert drift.label_entropy_share([3, 3, 3]) == pytest.approx(1.0)
    assert drift.label_entropy_share([9, 0, 0]) < drift.label_entropy_share([5, 4, 0]) < 1.0
    start = {"p": np.array([1.0, -2.0])}
    trained = {"p": np.array([3.0, 2.0])}
    np.testing.assert_allclose(drift.scaled_update(trained, start, 0.25)["p"], [1.5, -1.0])
    np.testing.assert_allclose(drift.scaled_update(trained, start, 1.0)["p"], trained["p"])
    np.testing.assert_allclose(drift.scaled_update(trained, start, 0.0)["p"], start["p"])
    with pytest.raises(drift.DriftError, match=r"\[0, 1\]"):
        drift.scaled_update(trained, start, 1.5)
    with pytest.raises(drift.DriftError, match="name different tensors"):
        drift.scaled_update(trained, {"q": np.zeros(2)}, 0.5)
    spec = FederationSpec(drift_correction={"name": "fedprox", "entropy_scaling": True})
    assert spec.drift_correction is not None and spec.drift_correction.entropy_scaling
