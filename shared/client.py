"""A typed httpx client of the coordinator's REST API, used by workers, the CLI and tests. Over
https it verifies the coordinator (and presents the site's certificate) as shared/tls.py says.

The answers a client acts on (a federation's status, enrolment, the task, the receipts) come back as
shared/contract.py's models, validated from the JSON; the open-ended ones (round history, evaluations,
clients, events, the spec) as the JSON objects they are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from fedprompt.shared.contract import (
    Enrolled,
    EnrolmentToken,
    EvaluationStored,
    FederationStatus,
    InitialPrompt,
    ModelParameters,
    SecaggStored,
    Task,
    TaskAnswer,
    UploadReceipt,
)
from fedprompt.shared.tls import ClientTLS, default_context
from pydantic import TypeAdapter

API = "/api/v1"

# The answers read as plain JSON objects: round records, evaluations, sites, clients, events and the
# spec are read key by key by the CLI's views and the simulation's result tables (and the spec is
# validated as a FederationSpec by whoever needs one); only their shape is checked here.
_OBJECT: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])
_OBJECT_OR_NULL: TypeAdapter[dict[str, Any] | None] = TypeAdapter(dict[str, Any] | None)
_OBJECTS: TypeAdapter[list[dict[str, Any]]] = TypeAdapter(list[dict[str, Any]])
_STATUSES: TypeAdapter[list[FederationStatus]] = TypeAdapter(list[FederationStatus])


class ApiError(RuntimeError):
    """The coordinator answered with an error (problem+json)."""

    def __init__(self, status: int, problem: dict[str, Any], retry_after: float | None = None) -> None:
        self.status = status
        self.problem = problem
        self.retry_after = retry_after
        super().__init__(f"HTTP {status}: {problem.get('detail') or problem.get('title') or problem}")


@dataclass(frozen=True)
class Prompt:
    """A downloaded prompt version."""

    version: int
    sha256: str
    blob: bytes


class CoordinatorClient:
    """Thin wrapper over the REST API; the transport is injectable (MockTransport, ASGITransport)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
        tls: ClientTLS | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.tls = ClientTLS.from_env() if tls is None else tls
        self.http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=timeout,
            transport=transport,
            verify=self.tls.verify()
            if base_url.startswith("https:") and transport is None
            else default_context(),
        )

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def with_token(self, token: str) -> CoordinatorClient:
        """A client for the same coordinator that authenticates with another token."""
        return CoordinatorClient(
            str(self.http.base_url),
            token,
            timeout=self.http.timeout.read or 60.0,
            transport=self.http._transport,
            tls=self.tls,
        )

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        resp = self.http.request(method, path, **kw)
        if resp.status_code >= 400:
            try:
                problem = resp.json()
            except ValueError:
                problem = {"detail": resp.text[:500]}
            raise ApiError(
                resp.status_code,
                problem if isinstance(problem, dict) else {"detail": str(problem)},
                retry_after=_retry_after(resp.headers.get("retry-after")),
            )
        return resp

    # operator
    def create_federation(self, spec: dict[str, Any]) -> FederationStatus:
        """POST a federation spec → the new federation's status."""
        return FederationStatus.model_validate(self._call("POST", f"{API}/federations", json=spec).json())

    def federations(self) -> list[FederationStatus]:
        """All federations."""
        return _STATUSES.validate_python(self._call("GET", f"{API}/federations").json())

    def federation(self, fid: int) -> FederationStatus:
        """One federation's status."""
        return FederationStatus.model_validate(self._call("GET", f"{API}/federations/{fid}").json())

    def create_enrollment_token(
        self, fid: int, *, expires_in_s: float | None = None, max_uses: int | None = None
    ) -> str:
        """A new enrolment token."""
        body = {"expires_in_s": expires_in_s, "max_uses": max_uses}
        resp = self._call("POST", f"{API}/federations/{fid}/enrollment-tokens", json=body)
        return EnrolmentToken.model_validate(resp.json()).token

    def clients(self, fid: int) -> list[dict[str, Any]]:
        """Enrolled clients."""
        return _OBJECTS.validate_python(self._call("GET", f"{API}/federations/{fid}/clients").json())

    def revoke_client(self, fid: int, cid: int) -> None:
        """Revoke a client."""
        self._call("DELETE", f"{API}/federations/{fid}/clients/{cid}")

    def open_round(self, fid: int) -> dict[str, Any]:
        """Open the next round now."""
        return _OBJECT.validate_python(self._call("POST", f"{API}/federations/{fid}/rounds").json())

    def close_round(self, fid: int, number: int) -> dict[str, Any]:
        """Aggregate the open round now."""
        resp = self._call("POST", f"{API}/federations/{fid}/rounds/{number}/close")
        return _OBJECT.validate_python(resp.json())

    def rounds(self, fid: int) -> list[dict[str, Any]]:
        """Round history."""
        return _OBJECTS.validate_python(self._call("GET", f"{API}/federations/{fid}/rounds").json())

    def evaluation(self, fid: int, version: int) -> dict[str, Any] | None:
        """Sample-weighted evaluation of a prompt version (None before any report)."""
        resp = self._call("GET", f"{API}/federations/{fid}/evaluations/{version}")
        return _OBJECT_OR_NULL.validate_python(resp.json())

    def events(self, fid: int, *, after: int = 0) -> list[dict[str, Any]]:
        """The federation's audit trail (events after id `after`)."""
        resp = self._call("GET", f"{API}/federations/{fid}/events", params={"after": after})
        return _OBJECTS.validate_python(resp.json())

    def site_evaluations(self, fid: int, version: int) -> dict[str, Any]:
        """Each site's own evaluation of a prompt version and their spread (403 under secure
        aggregation unless the spec lets sites report their confusion matrices)."""
        resp = self._call("GET", f"{API}/federations/{fid}/evaluations/{version}/sites")
        return _OBJECT.validate_python(resp.json())

    def pause(self, fid: int) -> FederationStatus:
        """Stop auto-advance."""
        return FederationStatus.model_validate(self._call("POST", f"{API}/federations/{fid}/pause").json())

    def resume(self, fid: int) -> FederationStatus:
        """Restart auto-advance."""
        return FederationStatus.model_validate(self._call("POST", f"{API}/federations/{fid}/resume").json())

    def set_initial_prompt(self, fid: int, blob: bytes) -> InitialPrompt:
        """Replace prompt version 0 before round 1."""
        resp = self._call("PUT", f"{API}/federations/{fid}/prompts/0", content=blob)
        return InitialPrompt.model_validate(resp.json())

    # worker
    def spec(self, fid: int) -> dict[str, Any]:
        """The federation's spec (admin or client token)."""
        return _OBJECT.validate_python(self._call("GET", f"{API}/federations/{fid}/spec").json())

    def enroll(
        self,
        fid: int,
        enrollment_token: str,
        *,
        name: str,
        num_samples: int,
        info: dict[str, Any],
        model_parameters: int | None = None,
    ) -> Enrolled:
        """Enrol with an enrolment token → the client's id and token; `model_parameters`: the whole
        frozen model's size, the ledger's full fine-tuning reference when the spec does not state it."""
        body: dict[str, Any] = {"name": name, "num_samples": num_samples, "info": info}
        if model_parameters is not None:
            body["model_parameters"] = model_parameters
        resp = self._call(
            "POST",
            f"{API}/federations/{fid}/clients",
            json=body,
            headers={"Authorization": f"Bearer {enrollment_token}"},
        )
        return Enrolled.model_validate(resp.json())

    def state_model_parameters(self, fid: int, model_parameters: int) -> int | None:
        """State the loaded model's parameter count (client token) → the federation's figure."""
        resp = self._call(
            "PUT", f"{API}/federations/{fid}/model-parameters", json={"model_parameters": model_parameters}
        )
        return ModelParameters.model_validate(resp.json()).model_parameters

    def activity(self, fid: int, activity: dict[str, Any]) -> None:
        """A heartbeat (client token): what this worker is doing, e.g. {"phase": "training", "round": 3,
        "step": 40, "total_steps": 100}."""
        self._call("PUT", f"{API}/federations/{fid}/activity", json=activity)

    def task(self, fid: int, *, wait: float = 0.0) -> TaskAnswer | None:
        """The next task (its kind's model), or None (204) after long-polling `wait` seconds; a task
        this client cannot read (a kind it does not know) raises pydantic's ValidationError."""
        read = self.http.timeout.read
        resp = self._call(
            "GET",
            f"{API}/federations/{fid}/task",
            params={"wait": wait},
            timeout=None if read is None else read + wait,
        )
        return None if resp.status_code == 204 else Task.model_validate(resp.json()).root

    def prompt(self, fid: int, version: int | str = "latest") -> Prompt:
        """Download a prompt version."""
        resp = self._call("GET", f"{API}/federations/{fid}/prompts/{version}")
        return Prompt(int(resp.headers["X-Prompt-Version"]), resp.headers["X-Prompt-Sha256"], resp.content)

    def control(self, fid: int, version: int) -> bytes:
        """SCAFFOLD's server control variate after a prompt version (safetensors)."""
        return self._call("GET", f"{API}/federations/{fid}/prompts/{version}/control").content

    def export(self, fid: int, version: int | str = "latest", fmt: str = "peft") -> bytes:
        """A prompt version in an outside format (peft: a zipped adapter folder)."""
        params = {"format": fmt, "version": str(version)}
        return self._call("GET", f"{API}/federations/{fid}/export", params=params).content

    def upload(self, fid: int, number: int, blob: bytes) -> tuple[int, UploadReceipt]:
        """Upload an update → (status, receipt); 200 means an identical earlier upload."""
        resp = self._call(
            "PUT",
            f"{API}/federations/{fid}/rounds/{number}/update",
            content=blob,
            headers={"Content-Type": "application/octet-stream"},
        )
        return resp.status_code, UploadReceipt.model_validate(resp.json())

    def secagg_stage(self, fid: int, number: int, stage: str, payload: dict[str, Any]) -> SecaggStored:
        """A secure round's stage answer (keys, shares or unmask) → its receipt."""
        resp = self._call("POST", f"{API}/federations/{fid}/rounds/{number}/secagg/{stage}", json=payload)
        return SecaggStored.model_validate(resp.json())

    def report_evaluation(self, fid: int, number: int, report: dict[str, Any]) -> EvaluationStored:
        """Report metrics of the prompt produced by round `number`."""
        resp = self._call("POST", f"{API}/federations/{fid}/rounds/{number}/evaluation", json=report)
        return EvaluationStored.model_validate(resp.json())


def _retry_after(value: str | None) -> float | None:
    """Seconds of a Retry-After header given in seconds (the coordinator's form); None otherwise."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None
