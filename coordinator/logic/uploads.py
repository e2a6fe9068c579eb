"""The checks of an uploaded update: its metadata, and whether it may be stored in its round. No I/O.

The upload use case (coordinator/usecases/uploads.py) reads what these checks need in one
transaction and hands it over as plain values; each check answers or raises the ServiceError that
says why not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from fedprompt.coordinator.errors import Conflict, Forbidden, Gone, Invalid, NotFound, revoked_client
from fedprompt.coordinator.logic import buffered
from fedprompt.coordinator.persistence.db import MAX_ID
from fedprompt.shared import jsonlimits, wire
from fedprompt.shared.contract import UploadReceipt
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.vocab import RoundState


@dataclass(frozen=True)
class UploadResult:
    """An upload's receipt (what the API answers: shared/contract.py's UploadReceipt; an identical
    retry answers the same), whether this upload stored the update, and whether the round is now
    complete."""

    round: int
    attempt: int
    client_id: int
    sha256: str
    num_samples: int  # the weight stored: the declared figure, at most the client's enrolled one
    size: int
    created: bool = False
    # the round had every selected client's update once this one's batch was stored (then the
    # caller closes it: after_upload); across replicas, a round two batches complete together is
    # closed by the deadline sweep, within FEDPROMPT_SWEEP_INTERVAL_S
    round_complete: bool = False
    # mode async: the buffer (round id) whose version counts this update, and its staleness there
    buffer_round_id: int | None = None
    staleness: int | None = None

    def receipt(self) -> UploadReceipt:
        """The receipt, as the API answers it."""
        return UploadReceipt(**{name: getattr(self, name) for name in UploadReceipt.model_fields})


@dataclass(frozen=True)
class PendingUpload:
    """A validated update on its way into the database (see Uploads.upload)."""

    number: int
    client_id: int
    body: bytes
    digest: str
    num_samples: int  # as declared in its metadata
    metrics: dict[str, Any]
    base_version: str | None


class StoredUpdate(NamedTuple):
    """What the checks need of an update already stored."""

    sha256: str
    num_samples: int
    size: int


class Buffer(NamedTuple):
    """Mode async: the open buffer (round) an update may be counted in, and the staleness allowed."""

    id: int
    number: int
    max_staleness: int


class Selection(NamedTuple):
    """A participant of a round as the checks see it: revoked or not, and the samples it enrolled with."""

    revoked_at: float | None
    enrolled_samples: int


def weight(declared: int, enrolled: int) -> int:
    """An update's FedAvg weight: the num_samples it declares, clipped to the figure its client enrolled
    with (at least 1), so that a client cannot inflate its share of the average."""
    return min(declared, max(enrolled, 1))


def no_replacing(client_id: int, number: int) -> Conflict:
    return Conflict(
        f"client {client_id} already uploaded a different update for round {number}; "
        "an update cannot be replaced"
    )


def check_update(
    item: PendingUpload,
    attempts: Sequence[Any],
    stored: Mapping[tuple[int, int], StoredUpdate],
    selected: Mapping[tuple[int, int], Selection],
    current_round: int,
    buffer: Buffer | None = None,
) -> UploadResult:
    """Whether a validated upload may be stored: an UploadResult (created: insert it, with its weight
    clipped to the enrolled figure; not created: an identical re-send of an acknowledged upload), or
    the ServiceError that says why not.

    `attempts` are the round's attempts, latest first (rows with id, attempt, state, base_version);
    `stored` and `selected` are keyed by (round attempt id, client id). `buffer` (mode async): the open
    buffer, where an update of a round that closed meanwhile is counted if it is not too stale.
    """
    number, cid, digest = item.number, item.client_id, item.digest
    if not attempts:
        raise NotFound(f"round {number} has not been opened; the current round is {current_round}")
    for rnd in attempts:  # an identical re-send of an acknowledged upload: same answer
        upd = stored.get((rnd.id, cid))
        if upd is not None and upd.sha256 == digest:
            return UploadResult(number, rnd.attempt, cid, digest, upd.num_samples, upd.size, created=False)
    current = attempts[0]
    counted_in, tau = (current.id, 0) if buffer is not None else (None, None)
    if current.state != RoundState.OPEN:
        if buffer is None or current.state != RoundState.CLOSED:
            raise Gone(f"round {number} is {current.state}; the current round is {current_round}")
        tau = buffered.staleness(buffer.number - 1, current.base_version)
        if buffered.too_stale(tau, buffer.max_staleness):
            raise Gone(
                f"update of round {number} was trained from version {current.base_version}, {tau} versions "
                f"behind the latest ({buffer.number - 1}), more than max_staleness {buffer.max_staleness}; "
                "ask for a new task and train from the latest version"
            )
        counted_in = buffer.id
    if (current.id, cid) in stored:
        raise no_replacing(cid, number)
    participant = selected.get((current.id, cid))
    if participant is None:
        raise Forbidden(f"client {cid} was not selected for round {number}")
    if participant.revoked_at is not None:  # revoked by another process, within its auth cache
        raise revoked_client(cid)
    if item.base_version is not None and item.base_version != str(current.base_version):
        raise Conflict(
            f"update was trained from prompt version {item.base_version}, but round {number} "
            f"starts from version {current.base_version}; download it and train again"
        )
    samples = weight(item.num_samples, participant.enrolled_samples)
    return UploadResult(
        number,
        current.attempt,
        cid,
        digest,
        samples,
        len(item.body),
        created=True,
        buffer_round_id=counted_in,
        staleness=tau,
    )


def _finite_number(value: Any) -> bool:
    """A JSON number that is a finite float (not a bool, not an int beyond float's range)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


# An integer as metadata carries it: ASCII digits only (str.isdigit() and int() also take '²', '١'),
# ten at most (ids and counts are 32-bit).
DECIMAL = re.compile(r"[+-]?[0-9]{1,10}")


def declared_samples(meta: Mapping[str, str]) -> int | None:
    """The num_samples an update's metadata declares, if it is a decimal integer."""
    raw = meta.get("num_samples")
    return int(raw.strip()) if raw is not None and DECIMAL.fullmatch(raw.strip()) else None


def parse_update_metadata(meta: dict[str, str], spec: FederationSpec) -> tuple[int, dict[str, Any]]:
    """num_samples and metrics from an update's safetensors metadata, checked."""
    if meta.get("format") != wire.FORMAT:
        raise Invalid(f"metadata 'format' must be '{wire.FORMAT}' (got {meta.get('format')!r})")
    method = meta.get("method")
    if method is not None and method != spec.method:
        raise Invalid(f"update was made with method '{method}', the federation uses '{spec.method}'")
    fingerprint = meta.get("model_fingerprint")
    if spec.model_fingerprint and fingerprint and fingerprint != spec.model_fingerprint:
        raise Invalid(
            f"update comes from model {fingerprint}; the federation's model is {spec.model_fingerprint}"
        )
    num_samples = declared_samples(meta)
    if num_samples is None:
        raise Invalid("metadata 'num_samples' (a positive integer) is required in the safetensors header")
    if num_samples < 1 or num_samples > MAX_ID:
        raise Invalid(f"metadata 'num_samples' must be a positive integer, got {num_samples}")
    metrics: dict[str, Any] = {}
    if "metrics" in meta:
        try:  # bounded: nesting depth and number length (a 5,000-digit number is refused, not parsed)
            metrics = jsonlimits.loads(meta["metrics"], what="metadata 'metrics'")
        except jsonlimits.JSONLimitError as exc:
            raise Invalid(f"metadata 'metrics' must be a JSON object: {exc}") from None
        if not isinstance(metrics, dict) or not all(_finite_number(v) for v in metrics.values()):
            raise Invalid("metadata 'metrics' must be a JSON object of finite numbers")
    return num_samples, metrics
