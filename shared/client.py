"""A typed httpx client of the coordinator's REST API, used by workers, the CLI and tests. Over
https it verifies the coordinator (and presents the site's certificate) as shared/tls.py says."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from fedprompt.shared.tls import ClientTLS

API = "/api/v1"


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
            verify=self.tls.verify() if base_url.startswith("https:") and transport is None else True,
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
    def create_federation(self, spec: dict[str, Any]) -> dict[str, Any]:
        """POST a federation spec."""
        return self._call("POST", f"{API}/federations", json=spec).json()

    def federations(self) -> list[dict[str, Any]]:
        """All federations."""
        return self._call("GET", f"{API}/federations").json()

    def federation(self, fid: int) -> dict[str, Any]:
        """One federation's status."""
        return self._call("GET", f"{API}/federations/{fid}").json()

    def create_enrollment_token(
        self, fid: int, *, expires_in_s: float | None = None, max_uses: int | None = None
    ) -> str:
        """A new enrolment token."""
        body = {"expires_in_s": expires_in_s, "max_uses": max_uses}
        return self._call("POST", f"{API}/federations/{fid}/enrollment-tokens", json=body).json()["token"]

    def clients(self, fid: int) -> list[dict[str, Any]]:
        """Enrolled clients."""
        return self._call("GET", f"{API}/federations/{fid}/clients").json()

    def revoke_client(self, fid: int, cid: int) -> None:
        """Revoke a client."""
        self._call("DELETE", f"{API}/federations/{fid}/clients/{cid}")

    def open_round(self, fid: int) -> dict[str, Any]:
        """Open the next round now."""
        return self._call("POST", f"{API}/federations/{fid}/rounds").json()

    def close_round(self, fid: int, number: int) -> dict[str, Any]:
        """Aggregate the open round now."""
        return self._call("POST", f"{API}/federations/{fid}/rounds/{number}/close").json()

    def rounds(self, fid: int) -> list[dict[str, Any]]:
        """Round history."""
        return self._call("GET", f"{API}/federations/{fid}/rounds").json()

    def evaluation(self, fid: int, version: int) -> dict[str, Any] | None:
        """Sample-weighted evaluation of a prompt version (None before any report)."""
        return self._call("GET", f"{API}/federations/{fid}/evaluations/{version}").json()

    def events(self, fid: int, *, after: int = 0) -> list[dict[str, Any]]:
        """The federation's audit trail (events after id `after`)."""
        return self._call("GET", f"{API}/federations/{fid}/events", params={"after": after}).json()

    def site_evaluations(self, fid: int, version: int) -> dict[str, Any]:
        """Each site's own evaluation of a prompt version and their spread (403 under secure
        aggregation unless the spec lets sites report their confusion matrices)."""
        return self._call("GET", f"{API}/federations/{fid}/evaluations/{version}/sites").json()

    def pause(self, fid: int) -> dict[str, Any]:
        """Stop auto-advance."""
        return self._call("POST", f"{API}/federations/{fid}/pause").json()

    def resume(self, fid: int) -> dict[str, Any]:
        """Restart auto-advance."""
        return self._call("POST", f"{API}/federations/{fid}/resume").json()

    def set_initial_prompt(self, fid: int, blob: bytes) -> dict[str, Any]:
        """Replace prompt version 0 before round 1."""
        return self._call("PUT", f"{API}/federations/{fid}/prompts/0", content=blob).json()

    # worker
    def spec(self, fid: int) -> dict[str, Any]:
        """The federation's spec (admin or client token)."""
        return self._call("GET", f"{API}/federations/{fid}/spec").json()

    def enroll(
        self,
        fid: int,
        enrollment_token: str,
        *,
        name: str,
        num_samples: int,
        info: dict[str, Any],
        model_parameters: int | None = None,
    ) -> dict:
        """Enrol with an enrolment token → {client_id, token}; `model_parameters`: the whole frozen
        model's size, the ledger's full fine-tuning reference when the spec does not state it."""
        body: dict[str, Any] = {"name": name, "num_samples": num_samples, "info": info}
        if model_parameters is not None:
            body["model_parameters"] = model_parameters
        return self._call(
            "POST",
            f"{API}/federations/{fid}/clients",
            json=body,
            headers={"Authorization": f"Bearer {enrollment_token}"},
        ).json()

    def state_model_parameters(self, fid: int, model_parameters: int) -> int | None:
        """State the loaded model's parameter count (client token) → the federation's figure."""
        resp = self._call(
            "PUT", f"{API}/federations/{fid}/model-parameters", json={"model_parameters": model_parameters}
        )
        return resp.json()["model_parameters"]

    def activity(self, fid: int, activity: dict[str, Any]) -> None:
        """A heartbeat (client token): what this worker is doing, e.g. {"phase": "training", "round": 3,
        "step": 40, "total_steps": 100}."""
        self._call("PUT", f"{API}/federations/{fid}/activity", json=activity)

    def task(self, fid: int, *, wait: float = 0.0) -> dict[str, Any] | None:
        """The next task, or None (204) after long-polling `wait` seconds."""
        resp = self._call(
            "GET",
            f"{API}/federations/{fid}/task",
            params={"wait": wait},
            timeout=self.http.timeout.read + wait,
        )
        return None if resp.status_code == 204 else resp.json()

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

    def upload(self, fid: int, number: int, blob: bytes) -> tuple[int, dict[str, Any]]:
        """Upload an update → (status, body); 200 means an identical earlier upload."""
        resp = self._call(
            "PUT",
            f"{API}/federations/{fid}/rounds/{number}/update",
            content=blob,
            headers={"Content-Type": "application/octet-stream"},
        )
        return resp.status_code, resp.json()

    def secagg_stage(self, fid: int, number: int, stage: str, payload: dict[str, Any]) -> dict[str, Any]:
        """A secure round's stage answer (keys, shares or unmask) → its receipt."""
        return self._call(
            "POST", f"{API}/federations/{fid}/rounds/{number}/secagg/{stage}", json=payload
        ).json()

    def report_evaluation(self, fid: int, number: int, report: dict[str, Any]) -> dict[str, Any]:
        """Report metrics of the prompt produced by round `number`."""
        return self._call("POST", f"{API}/federations/{fid}/rounds/{number}/evaluation", json=report).json()


def _retry_after(value: str | None) -> float | None:
    """Seconds of a Retry-After header given in seconds (the coordinator's form); None otherwise."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None
