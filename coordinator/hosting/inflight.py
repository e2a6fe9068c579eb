"""Per-holder caps on request bodies in progress and on the bytes they hold (pure logic, no I/O).

An upload's body is held in memory from its first byte until the database has it. Without a cap,
one client could open 40 uploads and stop each one byte short of the limit: 600 MB held. Here a
holder (a client id, or "admin" for the initial prompt) may have at most ``max_uploads`` uploads in
progress and ``max_bytes`` bytes in them; past either, the upload is refused with 429 and
Retry-After before more of its body is read (the body's deadline, FEDPROMPT_BODY_TIMEOUT_S, ends
the ones that stall). On top of the holders' caps, ``max_total_bytes`` bounds the bytes of all
holders together, so what a process holds does not grow with the number of enrolled clients. The
same gate, keyed by address, bounds the JSON bodies one address has in flight: FastAPI reads those
before any token is checked. One gate of each per process, used from the event loop only.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from fedprompt.coordinator.hosting.ratelimit import RateLimited

RETRY_AFTER_S = 1


@dataclass
class _Held:
    uploads: int = 0
    bytes: int = 0


@dataclass
class Ticket:
    """One upload's share of its holder's allowance; ``add`` counts its bytes, ``close`` frees all."""

    gate: UploadGate
    holder: Hashable
    bytes: int = 0
    closed: bool = field(default=False)

    def add(self, n: int) -> None:
        """Count n more bytes of this upload; RateLimited if the holder's bytes would pass the cap."""
        held = self.gate._held[self.holder]
        if held.bytes + n > self.gate.max_bytes:
            raise RateLimited(
                f"{_who(self.holder)} has {held.bytes + n} bytes of {self.gate.what} in progress, over "
                f"this coordinator's {self.gate.max_bytes} ({self.gate.bytes_knob}); retry when the "
                f"others are done",
                retry_after=RETRY_AFTER_S,
            )
        gate = self.gate
        if gate.max_total_bytes is not None and gate.total_bytes + n > gate.max_total_bytes:
            raise RateLimited(
                f"this coordinator holds {gate.total_bytes} bytes of {gate.what} in progress from all "
                f"callers; {n} more would pass its {gate.max_total_bytes} ({gate.total_knob}); retry in "
                f"{RETRY_AFTER_S} s",
                retry_after=RETRY_AFTER_S,
            )
        held.bytes += n
        self.bytes += n
        gate.total_bytes += n

    def close(self) -> None:
        """Give back this upload's place and bytes (idempotent)."""
        if self.closed:
            return
        self.closed = True
        held = self.gate._held[self.holder]
        held.uploads -= 1
        held.bytes -= self.bytes
        self.gate.total_bytes -= self.bytes
        if held.uploads <= 0:
            del self.gate._held[self.holder]

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class UploadGate:
    """At most `max_uploads` uploads and `max_bytes` bytes in progress per holder, and at most
    `max_total_bytes` (None: no limit) of all holders together."""

    def __init__(
        self,
        max_uploads: int,
        max_bytes: int,
        *,
        max_total_bytes: int | None = None,
        what: str = "uploads",
        count_knob: str = "FEDPROMPT_MAX_UPLOADS_PER_CLIENT",
        bytes_knob: str = "FEDPROMPT_MAX_UPLOAD_BYTES_IN_FLIGHT_PER_CLIENT",
        total_knob: str = "FEDPROMPT_MAX_UPLOAD_BYTES_IN_FLIGHT",
    ) -> None:
        self.max_uploads = max_uploads
        self.max_bytes = max_bytes
        self.max_total_bytes = max_total_bytes
        self.what, self.count_knob, self.bytes_knob, self.total_knob = (
            what,
            count_knob,
            bytes_knob,
            total_knob,
        )
        self._held: dict[Hashable, _Held] = {}
        self.total_bytes = 0

    def open(self, holder: Hashable, declared: int | None = None) -> Ticket:
        """A ticket for one more upload of `holder` (its declared size reserved), or RateLimited."""
        held = self._held.get(holder, _Held())
        if held.uploads >= self.max_uploads:
            raise RateLimited(
                f"{_who(holder)} has {held.uploads} {self.what} in progress, this coordinator's limit "
                f"({self.count_knob}); retry when they are done",
                retry_after=RETRY_AFTER_S,
            )
        held.uploads += 1
        self._held[holder] = held
        ticket = Ticket(self, holder)
        if declared:
            try:
                ticket.add(declared)
            except RateLimited:
                ticket.close()
                raise
        return ticket

    def held(self, holder: Hashable) -> tuple[int, int]:
        """(uploads, bytes) in progress for a holder."""
        h = self._held.get(holder)
        return (h.uploads, h.bytes) if h is not None else (0, 0)


def _who(holder: Hashable) -> str:
    if isinstance(holder, int):
        return f"client {holder}"
    if isinstance(holder, tuple) and holder[:1] == ("address",):
        return "this address"
    return str(holder)
