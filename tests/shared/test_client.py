"""CoordinatorClient turns error answers into ApiError, keeping the problem and the server's Retry-After."""

from __future__ import annotations

import httpx
import pytest
from fedprompt.shared.client import ApiError, CoordinatorClient


def _client(status: int, headers: dict[str, str], body: bytes) -> CoordinatorClient:
    def answer(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers, content=body)

    return CoordinatorClient("http://coordinator.test", "t", transport=httpx.MockTransport(answer))


@pytest.mark.parametrize(
    ("header", "expected"),
    [("17", 17.0), ("0.5", 0.5), ("Wed, 21 Oct 2026 07:28:00 GMT", None), ("-3", None), (None, None)],
)
def test_retry_after_seconds_reach_the_error(header: str | None, expected: float | None) -> None:
    headers = {"content-type": "application/problem+json"}
    if header is not None:
        headers["retry-after"] = header
    client = _client(429, headers, b'{"title": "Too Many Requests", "detail": "slow down"}')
    with pytest.raises(ApiError) as refused:
        client.federations()
    assert refused.value.status == 429
    assert refused.value.problem["detail"] == "slow down"
    assert refused.value.retry_after == expected


def test_a_non_json_error_body_is_kept_as_detail() -> None:
    client = _client(502, {"content-type": "text/plain"}, b"bad gateway")
    with pytest.raises(ApiError) as failed:
        client.federations()
    assert failed.value.status == 502 and failed.value.problem == {"detail": "bad gateway"}
    assert failed.value.retry_after is None
