"""Federations: created with their seeded initial prompt, paused and resumed, read as a spec or
exported as a PEFT adapter."""

from __future__ import annotations

from typing import Any

from fedprompt.coordinator.errors import Conflict, Invalid
from fedprompt.coordinator.logic.round_states import FEDERATION_START
from fedprompt.coordinator.logic.specs import check_aggregation, validate_spec
from fedprompt.coordinator.persistence.db import Federation, PromptVersion
from fedprompt.coordinator.persistence.store import Store
from fedprompt.coordinator.usecases.reads import Reads
from fedprompt.coordinator.usecases.rounds import RoundCycle
from fedprompt.shared import export, wire
from fedprompt.shared.spec import FederationSpec, initial_prompt
from fedprompt.shared.vocab import FederationState
from sqlalchemy import select


class Federations:
    """A federation's life outside its rounds.

    A spec that does not set its round deadline takes `default_round_deadline_s`
    (FEDPROMPT_DEFAULT_ROUND_DEADLINE_S); one whose prompt would be over `max_prompt_bytes` (the
    coordinator's upload limit) is refused. None: the spec's own default, no limit."""

    def __init__(
        self,
        store: Store,
        cycle: RoundCycle,
        reads: Reads,
        *,
        default_round_deadline_s: float | None = None,
        max_prompt_bytes: int | None = None,
    ) -> None:
        self.store = store
        self.cycle = cycle
        self.reads = reads
        self.default_round_deadline_s = default_round_deadline_s
        self.max_prompt_bytes = max_prompt_bytes

    def create_federation(self, spec: FederationSpec) -> Federation:
        """Create a federation and its seeded initial prompt (version 0)."""
        if self.default_round_deadline_s is not None and "round_deadline_s" not in spec.model_fields_set:
            spec = validate_spec({**spec.model_dump(), "round_deadline_s": self.default_round_deadline_s})
        size = spec.prompt_bytes()
        if self.max_prompt_bytes is not None and size > self.max_prompt_bytes:
            raise Invalid(
                f"the prompt would be {size} bytes, over this coordinator's upload limit of "
                f"{self.max_prompt_bytes} bytes (FEDPROMPT_MAX_UPLOAD_BYTES); use fewer virtual tokens, "
                f"a smaller prompt encoder (encoder_hidden_size) or another method"
            )
        check_aggregation(spec)
        now = self.store.clock()
        blob = wire.encode(initial_prompt(spec), {"version": "0", "method": spec.method})
        with self.store.tx() as s:
            fed = Federation(
                name=spec.name,
                spec=spec.model_dump(mode="json"),
                state=FEDERATION_START,
                paused=False,
                current_round=0,
                latest_version=0,
                created_at=now,
                updated_at=now,
            )
            s.add(fed)
            s.flush()
            s.add(
                PromptVersion(
                    federation_id=fed.id, version=0, blob=blob, sha256=wire.sha256(blob), created_at=now
                )
            )
            self.store.event(s, fed.id, "created", f"federation '{spec.name}' created")
        return fed

    def set_initial_prompt(self, fid: int, body: bytes) -> PromptVersion:
        """Replace version 0 (e.g. with a vocabulary-initialised prompt) before the first round opens."""
        with self.store.tx() as s:
            fed = self.store.lock_federation(s, fid)
            spec = self.store.spec_of(fed)
            try:
                tensors, _ = wire.decode_checked(body, spec.tensor_shapes())
            except wire.WireError as exc:
                raise Invalid(str(exc)) from None
            if fed.current_round > 0:
                raise Conflict("the initial prompt can only be replaced before round 1 opens")
            blob = wire.encode(tensors, {"version": "0", "method": spec.method})
            pv = s.scalars(
                select(PromptVersion).where(PromptVersion.federation_id == fid, PromptVersion.version == 0)
            ).one()
            pv.blob, pv.sha256, pv.created_at = blob, wire.sha256(blob), self.store.clock()
            self.store.event(s, fid, "initial_prompt", "initial prompt replaced")
        return pv

    def set_paused(self, fid: int, paused: bool) -> dict[str, Any]:
        """Pause (no new rounds open automatically) or resume (open the next round if due)."""
        with self.store.tx() as s:
            fed = self.store.lock_federation(s, fid)
            if fed.state == FederationState.COMPLETED:
                raise Conflict(f"federation {fid} is completed; there is nothing to pause or resume")
            fed.paused = paused
            fed.updated_at = self.store.clock()
            word = "paused" if paused else "resumed"
            self.store.event(s, fid, word, word)
            if not paused:
                self.cycle.advance(s, fed, manual=False)
        return self.reads.federation_status(fid)

    def federation_spec(self, fid: int) -> dict[str, Any]:
        """The federation's spec as JSON (a spec never changes: read once per process)."""
        return self.store.spec_json(fid)

    def export_prompt(self, fid: int, version: str | int, fmt: str) -> tuple[str, bytes]:
        """A prompt version in an outside format: (file name, bytes); 'peft' is a zipped PEFT adapter folder."""
        if fmt not in export.FORMATS:
            raise Invalid(f"unknown export format '{fmt}'; choose one of {', '.join(export.FORMATS)}")
        with self.store.sessions() as s:
            _, pv = self.store.prompt_version(s, fid, version)
            spec = self.store.spec(s, fid)
        tensors, _ = wire.decode(pv.blob)
        try:
            archive = export.peft_zip(spec, tensors, version=pv.version)
        except export.ExportError as exc:
            raise Invalid(f"cannot export federation {fid} as {fmt}: {exc}") from None
        return f"federation-{fid}-v{pv.version}-peft.zip", archive
