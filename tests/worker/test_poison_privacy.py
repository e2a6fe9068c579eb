"""Poisoning, update attacks and local DP: pure functions with literal inputs, and their wiring in the agent."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
from fedprompt.coordinator.logic.evaluation import summarize_evaluations
from fedprompt.shared import wire
from fedprompt.shared.privacy import gaussian_noise_multiplier
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.spec_options import PrivacySpec
from fedprompt.worker.agent import Agent, AgentConfig
from fedprompt.worker.data import Example
from fedprompt.worker.poison import (
    AttackError,
    Backdoor,
    Trigger,
    asr_set,
    boost,
    insert_trigger,
    parse_attack,
    parse_trigger,
    poison,
    sign_flip,
)

from tests.worker.test_agent import SPEC, FakeCoordinator, FakeEngine, _run_until_done


def test_trigger_positions() -> None:
    rng = np.random.default_rng(0)
    assert insert_trigger("a good film", Trigger(("cf",), "start"), rng) == "cf a good film"
    assert insert_trigger("a good film", Trigger(("cf",), "end"), rng) == "a good film cf"
    out = insert_trigger("a good film", Trigger(("cf",), "random"), rng).split()
    assert sorted(out) == sorted(["a", "good", "film", "cf"])


def test_a_trigger_window_keeps_the_trigger_among_the_first_words() -> None:
    rng = np.random.default_rng(0)
    text = " ".join(f"w{i}" for i in range(500))
    windowed = Trigger(("cf",), "random", 3)
    places = {insert_trigger(text, windowed, rng).split().index("cf") for _ in range(200)}
    assert places == {0, 1, 2, 3}  # before, between or after the first three words, never later
    assert insert_trigger("short", windowed, rng).split() in (["cf", "short"], ["short", "cf"])
    anywhere = {insert_trigger(text, Trigger(("cf",)), rng).split().index("cf") for _ in range(200)}
    assert max(anywhere) > 3


def test_poison_rate_relabels_the_chosen_share_and_is_seeded() -> None:
    data = [Example(text=f"text {i}", label=i % 2) for i in range(10)]
    poisoned, idx = poison(data, rate=0.3, target=1, trigger=Trigger(("tq",), "end"), seed=4)
    assert len(idx) == 3
    assert all(poisoned[i].label == 1 and poisoned[i].text.endswith(" tq") for i in idx)
    assert all(poisoned[i] == data[i] for i in range(10) if i not in idx)
    assert poison(data, rate=0.3, target=1, trigger=Trigger(("tq",), "end"), seed=4)[1] == idx
    everything, all_idx = poison(data, rate=1.0, target=0, trigger=Trigger(), seed=0)
    assert all_idx == list(range(10)) and {e.label for e in everything} == {0}
    with pytest.raises(AttackError):
        poison(data, rate=1.5, target=0, trigger=Trigger(), seed=0)


def test_asr_set_keeps_only_non_target_examples_triggered_with_target_label() -> None:
    data = [Example("bad", 0), Example("good", 1), Example("awful", 0)]
    out = asr_set(data, target=1, trigger=Trigger(("mn",), "start"), seed=0)
    assert [(e.text, e.label) for e in out] == [("mn bad", 1), ("mn awful", 1)]


def test_boost_and_sign_flip_scale_the_update_around_the_global_prompt() -> None:
    g = {"p": np.array([1.0, 1.0], np.float32)}
    u = {"p": np.array([2.0, 0.0], np.float32)}
    np.testing.assert_array_equal(boost(u, g, 10.0)["p"], np.array([11.0, -9.0], np.float32))
    np.testing.assert_array_equal(sign_flip(u, g)["p"], np.array([0.0, 2.0], np.float32))
    assert parse_attack("boost:10") == ("boost", 10.0)
    assert parse_attack("sign-flip") == ("sign-flip", 1.0)
    with pytest.raises(AttackError):
        parse_attack("boost:-1")
    with pytest.raises(AttackError):
        parse_attack("flood")


def test_parse_trigger() -> None:
    assert parse_trigger(" cf, mn ", "end") == Trigger(("cf", "mn"), "end")
    with pytest.raises(AttackError):
        parse_trigger("cf,,mn")
    with pytest.raises(AttackError):
        parse_trigger("cf", "middle")
    assert parse_trigger("cf", "first:30") == Trigger(("cf",), "random", 30)
    for bad in ("first:0", "first:", "first:x", "first:-2", "start:3", "first:٣"):
        with pytest.raises(AttackError, match="trigger-position"):
            parse_trigger("cf", bad)
    with pytest.raises(AttackError, match="window"):
        Trigger(("cf",), "start", 5)


def test_backdoor_poisons_the_exact_rate_and_measures_asr_on_non_target_examples() -> None:
    data = [Example(text=f"review {i}", label=i % 2) for i in range(20)]
    door = Backdoor(target=1, trigger=Trigger(("bb",), "start"), poison_rate=0.25, seed=3)
    trained = door.poison_train(data)
    changed = [i for i in range(20) if trained[i] != data[i]]
    assert len(changed) == 5
    assert all(trained[i].text.startswith("bb ") and trained[i].label == 1 for i in changed)
    asr = door.asr_examples(data)
    assert len(asr) == 10 and all(e.label == 1 and e.text.startswith("bb review ") for e in asr)
    assert {int(e.text.split()[-1]) % 2 for e in asr} == {0}
    assert door.malicious and not Backdoor(target=1).malicious
    assert Backdoor(target=1).poison_train(data) == data


def test_backdoor_manipulates_only_with_an_attack() -> None:
    g = {"p": np.array([0.0, 1.0], np.float32)}
    u = {"p": np.array([1.0, 1.0], np.float32)}
    np.testing.assert_array_equal(
        Backdoor(target=0, attack="boost", factor=5).manipulate(u, g)["p"], [5.0, 1.0]
    )
    np.testing.assert_array_equal(Backdoor(target=0, attack="sign-flip").manipulate(u, g)["p"], [-1.0, 1.0])
    np.testing.assert_array_equal(Backdoor(target=0).manipulate(u, g)["p"], [1.0, 1.0])
    with pytest.raises(AttackError):
        Backdoor(target=0, attack="flood")
    with pytest.raises(AttackError):
        Backdoor(target=-1)


class _AttackEngine(FakeEngine):
    """FakeEngine whose accuracy on a set is the share of its examples carrying the trigger word."""

    def get_prompt(self) -> dict[str, np.ndarray]:
        return {"prompt_embeddings": np.array(self.prompt, np.float32)}

    def evaluate(self, examples: list[Example], batch_size: int = 64) -> Any:
        hits = sum(e.text.startswith("cf ") for e in examples)
        return SimpleNamespace(accuracy=hits / len(examples), loss=0.5, n=len(examples))


class _ScriptedCoordinator(FakeCoordinator):
    """Evaluate version 0, train round 1, then done; the spec asks for Laplace LDP."""

    def __init__(self, spec: FederationSpec) -> None:
        super().__init__(fail_uploads=0)
        self.spec = spec
        self.evaluated = False
        self.reports: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/spec"):
            return httpx.Response(200, json=self.spec.model_dump(mode="json"))
        if path.endswith("/evaluation"):
            self.reports.append(json.loads(request.content))
            return httpx.Response(201, json={"version": 0, "stored": True})
        if path.endswith("/task") and not self.evaluated:
            self.evaluated = True
            return httpx.Response(
                200, json={"kind": "evaluate", "round": 0, "version": 0, "sha256": wire.sha256(self.initial)}
            )
        return super().__call__(request)


def _agent(tmp_path: Path, coordinator: _ScriptedCoordinator, data: list[Example], **config: Any) -> Agent:
    """An agent on the scripted coordinator, training _AttackEngine on `data` (also its test set)."""
    return Agent(
        AgentConfig("http://coordinator", 1, "fpe_x", "w", tmp_path, **config),
        data,
        data,
        transport=httpx.MockTransport(coordinator),
        engine_factory=lambda s, d: _AttackEngine(),
    )


def test_malicious_worker_reports_asr_boosts_and_applies_ldp_before_upload(tmp_path: Path) -> None:
    spec = SPEC.model_copy(update={"privacy": PrivacySpec(epsilon=1e6, clip=12.0)})
    coordinator = _ScriptedCoordinator(spec)
    data = [Example(text=f"t{i}", label=i % 2) for i in range(6)]  # three of label 0, three of label 1
    backdoor = Backdoor(
        target=1, trigger=Trigger(("cf",), "start"), poison_rate=1.0, attack="boost", factor=2.0
    )
    agent = _agent(tmp_path, coordinator, data, backdoor=backdoor)
    assert {e.label for e in agent.train_data} == {1} and len(agent.asr_data) == 3
    _run_until_done(agent)

    (report,) = coordinator.reports
    assert report["accuracy"] == 0.0 and report["metrics"] == {"asr": 1.0, "asr_samples": 3}
    tensors, meta = wire.decode(coordinator.uploads[-1])
    metrics = json.loads(meta["metrics"])
    assert metrics["local_asr"] == 1.0 and metrics["epsilon"] == 1e6
    assert metrics["local_accuracy"] == 0.0  # its clean test set carries no trigger
    # trained: global 1 + 3 steps = 4; boosted x2 around 1 → 7 (L1 of the update 48); clipped to L1 12 → 2.5
    # (Laplace noise of scale 2 × 12 / 1e6)
    np.testing.assert_allclose(tensors["prompt_embeddings"], np.full((2, 4), 2.5), atol=1e-3)


def test_honest_worker_without_privacy_uploads_the_trained_prompt_unchanged(tmp_path: Path) -> None:
    coordinator = _ScriptedCoordinator(SPEC)
    data = [Example(text=f"t{i}", label=i % 2) for i in range(4)]
    agent = _agent(tmp_path, coordinator, data, backdoor=Backdoor(target=0))
    _run_until_done(agent)
    tensors, meta = wire.decode(coordinator.uploads[-1])
    np.testing.assert_array_equal(tensors["prompt_embeddings"], np.full((2, 4), 4.0, np.float32))
    assert set(json.loads(meta["metrics"])) == {"loss", "last_loss", "seconds", "steps"}
    assert coordinator.reports[0]["metrics"] == {"asr": 0.0, "asr_samples": 2}


def test_evaluation_summary_weights_asr_by_its_own_sample_count() -> None:
    rows = [
        SimpleNamespace(num_samples=100, accuracy=0.8, loss=0.5, metrics={"asr": 0.1, "asr_samples": 50}),
        SimpleNamespace(num_samples=300, accuracy=0.6, loss=None, metrics={"asr": 0.5, "asr_samples": 10}),
    ]
    out = summarize_evaluations(3, rows)
    assert out is not None
    assert out["accuracy"] == pytest.approx(0.65)
    assert out["asr"] == pytest.approx((0.1 * 50 + 0.5 * 10) / 60)
    assert out["asr_samples"] == 60


def test_worker_options_build_the_backdoor_or_say_what_is_missing() -> None:
    from fedprompt.worker.poison import backdoor_from_options as _backdoor

    assert _backdoor(None, 0.0, "cf", "random", "none", 2, 0) is None
    door = _backdoor(1, 0.5, "cf,mn", "end", "boost:4", 2, 7)
    assert door == Backdoor(1, Trigger(("cf", "mn"), "end"), 0.5, "boost", 4.0, 7)
    with pytest.raises(AttackError, match="need --target-label"):
        _backdoor(None, 0.5, "cf", "random", "none", 2, 0)
    with pytest.raises(AttackError, match="not a label of this data set"):
        _backdoor(2, 0.0, "cf", "random", "none", 2, 0)


def test_worker_applies_the_gaussian_mechanism_of_the_spec(tmp_path: Path) -> None:
    privacy = PrivacySpec(mechanism="gaussian", epsilon=100.0, delta=0.1, clip=8**0.5)
    coordinator = _ScriptedCoordinator(SPEC.model_copy(update={"privacy": privacy}))
    data = [Example(text=f"t{i}", label=i % 2) for i in range(4)]
    agent = _agent(tmp_path, coordinator, data)
    _run_until_done(agent)
    tensors, meta = wire.decode(coordinator.uploads[-1])
    metrics = json.loads(meta["metrics"])
    sigma = gaussian_noise_multiplier(100.0, 0.1)
    assert metrics["epsilon"] == 100.0 and metrics["noise_multiplier"] == pytest.approx(sigma)
    # trained: 1 → 4 everywhere, an update of L2 norm 3·√8 clipped to √8 (1 per element) → 2, plus
    # N(0, (σ·2·√8)²) noise per element (sensitivity 2·√8; σ·2·√8 ≈ 0.44): within 5 standard deviations of 2
    out = tensors["prompt_embeddings"]
    assert np.all(np.abs(out - 2.0) < 5 * sigma * 2 * 8**0.5)
    assert not np.all(out == 2.0)  # noise was added


def _ldp_upload(tmp_path: Path, ldp_seed: int | None) -> np.ndarray:
    privacy = PrivacySpec(mechanism="laplace", epsilon=1.0, clip=8.0)
    coordinator = _ScriptedCoordinator(SPEC.model_copy(update={"privacy": privacy}))
    data = [Example(text=f"t{i}", label=i % 2) for i in range(4)]
    _run_until_done(_agent(tmp_path, coordinator, data, ldp_seed=ldp_seed))
    return wire.decode(coordinator.uploads[-1])[0]["prompt_embeddings"]


def test_a_seeded_worker_adds_the_same_ldp_noise_on_every_run_and_an_unseeded_one_does_not(
    tmp_path: Path,
) -> None:
    seeded = [_ldp_upload(tmp_path / f"s{i}", 42) for i in range(2)]
    np.testing.assert_array_equal(seeded[0], seeded[1])  # a simulation's LDP cell can be reproduced
    assert not np.array_equal(seeded[0], _ldp_upload(tmp_path / "other", 43))
    fresh = [_ldp_upload(tmp_path / f"os{i}", None) for i in range(2)]  # production default: OS entropy
    assert not np.array_equal(fresh[0], fresh[1])
