"""Domain errors raised by services; the API maps each to an RFC 9457 problem+json response."""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """Base class: an HTTP status, a short title and a detail a person can act on."""

    status = 400
    title = "Bad request"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class Unauthorized(ServiceError):
    status, title = 401, "Unauthorized"


class Forbidden(ServiceError):
    status, title = 403, "Forbidden"


class NotFound(ServiceError):
    status, title = 404, "Not found"


class Conflict(ServiceError):
    status, title = 409, "Conflict"


class Gone(ServiceError):
    status, title = 410, "Gone"


class TooLarge(ServiceError):
    status, title = 413, "Payload too large"


class Invalid(ServiceError):
    status, title = 422, "Unprocessable content"


def revoked_client(client_id: int) -> Forbidden:
    """The refusal of a revoked client's request (its token stops working; its writes are refused in
    their own transactions whatever an authentication cache still holds)."""
    return Forbidden(f"client {client_id} was revoked by the operator")
