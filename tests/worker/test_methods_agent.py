"""A worker whose local model differs from the federation's refuses to join, saying what differs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from fedprompt.shared.spec import FederationSpec
from fedprompt.worker.agent import Agent, AgentConfig
from fedprompt.worker.data import Example
from fedprompt.worker.engine import PromptEngine
from fedprompt.worker.engine.model import describe_objects, fingerprint_of
from fedprompt.worker.joining import FatalWorkerError, model_differences

from tests.worker.test_methods import TEMPLATES, WORDS, tiny_model


def _spec_for(kind: str, *, hidden: int = 32, method: str = "prefix_tuning") -> FederationSpec:
    model, tok = tiny_model(kind)
    if hidden != model.config.hidden_size:
        model.config.hidden_size = hidden  # a different model: only its description matters here
    description = describe_objects(model.config, tok)
    return FederationSpec(
        model=f"tiny-{kind}", method=method, hidden_size=hidden, num_layers=2, num_virtual_tokens=3,
        template=TEMPLATES["masked_lm"], model_fingerprint=fingerprint_of(description), model_info=description,
    )  # fmt: skip


def _agent(tmp_path: Path, spec: FederationSpec, calls: list[str]) -> Agent:
    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(f"{request.method} {request.url.path}")
        if request.url.path.endswith("/clients"):
            enrolled = {
                "client_id": 3,
                "token": "fpc_x",
                "federation_id": 1,
                "spec": spec.model_dump(mode="json"),
            }
            return httpx.Response(201, json=enrolled)
        if request.url.path.endswith("/spec"):
            return httpx.Response(200, json=spec.model_dump(mode="json"))
        return httpx.Response(404, json={"detail": "unexpected"})

    def engine(s: FederationSpec, device: str) -> Any:
        model, tok = tiny_model("bert")
        return PromptEngine.from_model(
            model, tok, template=s.template, verbalizer=WORDS, num_virtual_tokens=s.num_virtual_tokens,
            max_length=32, device="cpu", method=s.method,
        )  # fmt: skip

    examples = [Example("good", 1), Example("bad", 0)]
    config = AgentConfig(
        coordinator="http://c", federation_id=1, enrollment_token="fpe_x", name="w", state_dir=tmp_path
    )
    return Agent(config, examples, examples, transport=httpx.MockTransport(handler), engine_factory=engine)


def test_worker_with_another_model_refuses_to_join(tmp_path: Path) -> None:
    """The federation was made for a 64-wide model: the local 32-wide BERT refuses before any task."""
    calls: list[str] = []
    agent = _agent(tmp_path, _spec_for("bert", hidden=64), calls)
    with pytest.raises(FatalWorkerError) as info:
        agent._setup()
    message = str(info.value)
    assert "fingerprint" in message and "hidden_size: federation 64, local 32" in message
    assert "files config.json" in message
    assert not any(c.endswith("/task") or c.endswith("/update") for c in calls)


def test_worker_with_the_federations_model_joins(tmp_path: Path) -> None:
    """Same model, same method: no refusal; the engine has the method's tensors."""
    calls: list[str] = []
    spec = _spec_for("bert")
    agent = _agent(tmp_path, spec, calls)
    agent._setup()
    assert agent.engine.tensor_shapes() == spec.tensor_shapes()
    assert agent.engine.fingerprint == spec.model_fingerprint


def test_model_differences_names_each_field() -> None:
    """Sizes by value, files by name; nothing when either side is unknown."""
    a = {"hidden_size": 384, "num_layers": 6, "files": {"vocab.txt": "1", "config.json": "2"}}
    b = {"hidden_size": 768, "num_layers": 6, "files": {"vocab.txt": "1", "config.json": "3"}}
    assert model_differences(a, b) == "files config.json; hidden_size: federation 384, local 768"
    assert model_differences(None, b) == ""
