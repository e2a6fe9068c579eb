"""Joining a federation: enrol with a token (or reuse the saved credentials), and check that the local
model is the one the federation's spec names before any task is taken."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
from fedprompt.shared.client import ApiError, CoordinatorClient
from fedprompt.shared.contract import Enrolled
from fedprompt.shared.spec import FederationSpec
from fedprompt.worker.protocol import Engine
from fedprompt.worker.state import Credentials, StateDir

log = logging.getLogger("fedprompt.worker")


class FatalWorkerError(RuntimeError):
    """A problem retrying cannot fix (wrong model, refused enrolment); the message says what to do."""


def join(
    state: StateDir,
    coordinator: str,
    federation_id: int,
    enrollment_token: str | None,
    *,
    name: str,
    num_samples: int,
    num_eval: int,
    transport: httpx.BaseTransport | None,
    retry: Callable[[str, Callable[[], Enrolled]], Enrolled],
    on_enrol: Callable[[], None] = lambda: None,
) -> Credentials:
    """The saved credentials for this federation, or new ones from enrolling with the token (on_enrol
    is called first)."""
    creds = state.load_credentials(federation_id)
    if creds is not None:
        return creds
    if not enrollment_token:
        raise FatalWorkerError(
            f"no saved credentials in {state.credentials_path} and no enrolment token; pass --enrollment-token"
        )
    on_enrol()
    anon = CoordinatorClient(coordinator, transport=transport)
    try:
        enrolled = retry(
            "enrol",
            lambda: anon.enroll(
                federation_id,
                enrollment_token,
                name=name,
                num_samples=num_samples,
                info={"num_eval": num_eval},
            ),
        )
    except ApiError as exc:
        raise FatalWorkerError(f"enrolment refused: {exc}") from None
    finally:
        anon.close()
    creds = Credentials(coordinator, federation_id, enrolled.client_id, enrolled.token)
    state.save_credentials(creds)
    log.info("enrolled as client %s", creds.client_id)
    return creds


def check_model(spec: FederationSpec, engine: Engine) -> None:
    """Refuse a local model other than the federation's: fingerprint, prompt shapes and model family."""
    if spec.model_fingerprint and engine.fingerprint != spec.model_fingerprint:
        differs = model_differences(spec.model_info, getattr(engine, "description", None))
        raise FatalWorkerError(
            f"the local model's fingerprint {engine.fingerprint} differs from the federation's "
            f"{spec.model_fingerprint}"
            + (f" ({differs})" if differs else "")
            + f"; load exactly '{spec.model}'"
        )
    if engine.tensor_shapes() != spec.tensor_shapes():
        raise FatalWorkerError(
            f"the local model '{spec.model}' gives prompt shapes {engine.tensor_shapes()}, the federation "
            f"expects {spec.tensor_shapes()} (hidden_size={spec.hidden_size}); load the federation's model"
        )
    family = getattr(engine, "family", spec.family)
    if family != spec.family:
        raise FatalWorkerError(
            f"the local model is a {family} model, the federation reads label words as a {spec.family}; "
            f"load '{spec.model}'"
        )


def model_differences(expected: dict[str, Any] | None, local: dict[str, Any] | None) -> str:
    """What differs between the federation's model description and the local one (field: federation, local)."""
    if not expected or not local:
        return ""
    parts = []
    for key in sorted(set(expected) | set(local)):
        want, have = expected.get(key), local.get(key)
        if key == "files" and isinstance(want, dict) and isinstance(have, dict):
            changed = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
            if changed:
                parts.append("files " + ", ".join(changed))
        elif want != have:
            parts.append(f"{key}: federation {want}, local {have}")
    return "; ".join(parts)


def state_model_parameters(
    client: CoordinatorClient, spec: FederationSpec, engine: Engine, federation_id: int
) -> None:
    """Tell the coordinator the loaded model's parameter count when the spec does not state it: the
    ledger's full fine-tuning reference. Enrolment came before the model was known; the figure is
    only informational, so a failure is logged and the worker goes on."""
    count = getattr(engine, "model_parameters", None)
    if spec.params_full_model is not None or not callable(count):
        return
    try:
        stated = int(count())
        recorded = client.state_model_parameters(federation_id, stated)
    except (ApiError, httpx.HTTPError, ValueError, RuntimeError) as exc:
        log.warning("could not state the model's parameter count: %s", exc)
        return
    log.info("stated the model's %s parameters; the federation's figure is %s", stated, recorded)
