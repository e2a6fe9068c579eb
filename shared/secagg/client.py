"""A client's answers to the stages of a secure round, and every rule of the protocol the client can
check itself. No I/O: the worker (worker/secagg.py) keeps the secrets and the round record these
return in its state directory before it sends anything derived from them.

The client trusts nothing the coordinator says that it can compute: t and k come from its own copy of
the federation's spec (``Policy``) and the roster size, the graph from the roster's hash, and its
neighbours' keys must carry signatures by the signing keys it pinned for them. Per round attempt the
record (``RoundRecord``, a JSON object) holds what it was told and what it answered:

- shares: its number, the roster size m, k, t, the graph seed and its neighbours' signed keys;
- masked: the envelopes it received (at least t − 1, from neighbours only) and masked with;
- consistency: the one survivor set it signed;
- unmask: the one answer it gave (asked again, it repeats it; asked otherwise, it refuses).

Across attempts, ``Revealed`` maps each neighbour's mask key to the kind of share revealed for it, so
a client never reveals both the seed share and the key share of one neighbour's secrets.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from fedprompt.shared.secagg import graph, protocol, quantise, shamir, shares, signing
from fedprompt.shared.secagg.protocol import PeerKeys, ProtocolError, RoundSecrets, b64, unb64

RoundRecord = dict[str, Any]
Revealed = dict[str, str]  # neighbour's mask key (base64) -> "seed" | "key"
Pins = dict[str, str]  # client id -> signing key (base64)

MIN_SURVIVORS = 3  # below this, each of two survivors learns the other's update from the mean


@dataclass(frozen=True)
class Policy:
    """The protocol's numbers as the client computes them from its own copy of the spec."""

    threshold: float = 0.5
    neighbours: int | None = None
    min_clients: int = MIN_SURVIVORS
    clip: float = 1.0
    bits: int = 20

    @classmethod
    def from_spec(cls, spec: Any) -> Policy:
        """From a FederationSpec with secure_aggregation set."""
        sa = spec.secure_aggregation
        return cls(sa.threshold, sa.neighbours, spec.min_clients, sa.clip, sa.bits)

    @property
    def min_survivors(self) -> int:
        """The fewest clients any stage may go on with: max(min_clients, 3)."""
        return max(self.min_clients, MIN_SURVIVORS)

    def k(self, m: int) -> int:
        """The neighbourhood size for a roster of m clients (the graph's degree)."""
        wanted = graph.neighbourhood_size(m, self.threshold) if self.neighbours is None else self.neighbours
        return graph.regular_degree(m, wanted)

    def t(self, m: int) -> int:
        """The threshold for a roster of m clients."""
        return graph.threshold(self.k(m), self.threshold)


def context_of(federation_id: int, task: Mapping[str, Any]) -> bytes:
    """The round context of a task."""
    return protocol.round_context(federation_id, int(task["round"]), int(task["attempt"]))


def advertisement(
    own: RoundSecrets, signing_key: bytes, context: bytes, index: int, client_id: int
) -> dict[str, str]:
    """The keys stage's answer: round public keys, self-mask commitment, signing key, signature."""
    advert = {**own.advertisement(), "signing_key": b64(signing.public_key(signing_key))}
    advert["signature"] = b64(
        signing.sign(signing_key, signing.keys_message(context, index, client_id, advert))
    )
    return advert


def keys_payload(
    own: RoundSecrets,
    signing_key: bytes,
    federation_id: int,
    task: Mapping[str, Any],
    client_id: int,
    record: RoundRecord | None = None,
) -> tuple[dict[str, str], RoundRecord]:
    """The keys stage: the signed advertisement, and the record of this client's number (one number
    per round attempt: its keys are never signed under a second one)."""
    index = _own_index(task, record or {})
    if index < 1:
        raise ProtocolError(f"a client's number is at least 1; got {index}")
    return advertisement(own, signing_key, context_of(federation_id, task), index, client_id), {
        "index": index
    }


def check_advert(
    context: bytes, index: int, client_id: int, advert: Mapping[str, Any], pins: Mapping[str, str]
) -> PeerKeys:
    """A neighbour's advertisement: well formed, signed by its signing key, and that key the one pinned
    for its client id (if any)."""
    if set(advert) < set(signing.ADVERT_FIELDS):
        raise ProtocolError(
            f"the keys of number {index} lack {sorted(set(signing.ADVERT_FIELDS) - set(advert))}"
        )
    keys = PeerKeys.from_json(advert)
    public = unb64(str(advert["signing_key"]), signing.PUBLIC_BYTES)
    pinned = pins.get(str(client_id))
    if pinned is not None and pinned != advert["signing_key"]:
        raise ProtocolError(
            f"client {client_id} (number {index}) signs with a key other than the one this client pinned "
            "for it: a substituted key is refused"
        )
    message = signing.keys_message(context, index, client_id, advert)
    if not signing.verify(public, message, unb64(str(advert["signature"]), signing.SIGNATURE_BYTES)):
        raise ProtocolError(
            f"the keys of number {index} (client {client_id}) are not signed by its signing key"
        )
    return keys


def shares_payload(
    own: RoundSecrets,
    signing_key: bytes,
    client_id: int,
    policy: Policy,
    federation_id: int,
    task: Mapping[str, Any],
    record: RoundRecord,
    pins: Mapping[str, str],
    *,
    randbelow: shamir.RandBelow = secrets.randbelow,
) -> tuple[dict[str, Any], RoundRecord, Pins]:
    """The shares stage: an envelope for each neighbour, once the roster, the graph, k and t the task
    states are checked against the client's own computation (and the neighbours' signatures)."""
    context = context_of(federation_id, task)
    index = _own_index(task, record)
    roster = {int(j): entry for j, entry in dict(task["roster"]).items()}
    m = len(roster)
    if m < policy.min_survivors:
        raise ProtocolError(
            f"the roster holds {m} client(s), below this federation's minimum of {policy.min_survivors}"
        )
    own_advert = advertisement(own, signing_key, context, index, client_id)
    mine = roster.get(index)
    if (
        mine is None
        or int(mine["client_id"]) != client_id
        or mine["digest"] != signing.roster_digest(client_id, own_advert)
        or mine.get("signing_key") != own_advert["signing_key"]
    ):
        raise ProtocolError("the roster does not hold this client's keys as it advertised them")
    if len({int(e["client_id"]) for e in roster.values()}) != m:
        raise ProtocolError("the roster lists one client under two numbers")
    new_pins = dict(pins)
    for j, entry in roster.items():  # every member's signing key: pinned, or as pinned before
        cid, key = str(entry["client_id"]), str(entry.get("signing_key", ""))
        if cid in pins and pins[cid] != key:
            raise ProtocolError(
                f"the roster lists client {cid} (number {j}) with a signing key other than the one this "
                "client pinned for it: a substituted key is refused"
            )
        new_pins[cid] = key
    k, t = policy.k(m), policy.t(m)
    if int(task["t"]) < t:
        raise ProtocolError(
            f"the task's threshold t = {task['t']} is below this client's rule t = {t} (k = {k})"
        )
    seed = signing.roster_seed(context, {j: e["digest"] for j, e in roster.items()})
    expected = graph.relabel(graph.neighbours(m, seed, k), sorted(roster))[index]
    given = {int(j): a for j, a in dict(task["neighbours"]).items()}
    if sorted(given) != expected:
        raise ProtocolError(
            f"the task names neighbours {sorted(given)}; the roster's graph gives {expected} (k = {k})"
        )
    neighbours: dict[str, Any] = {}
    for j, advert in given.items():
        peer_id = int(roster[j]["client_id"])
        if int(advert.get("client_id", -1)) != peer_id:
            raise ProtocolError(f"the keys of number {j} name another client than the roster")
        fields = {f: str(advert[f]) for f in signing.ADVERT_FIELDS if f in advert}
        if signing.roster_digest(peer_id, fields) != roster[j]["digest"] or fields["signing_key"] != roster[
            j
        ].get("signing_key"):
            raise ProtocolError(f"the keys of number {j} differ from the roster's")
        check_advert(context, j, peer_id, fields, pins)
        new_pins[str(peer_id)] = fields["signing_key"]
        neighbours[str(j)] = {"client_id": peer_id, **fields}
    peers = {j: PeerKeys.from_json(a) for j, a in given.items()}
    envelopes = protocol.share_keys(own, index, peers, t, context, randbelow=randbelow)
    made = {
        **record,
        "index": index,
        "m": m,
        "k": k,
        "t": t,
        "seed": seed.hex(),
        "members": sorted(roster),
        "neighbours": neighbours,
    }
    return {"envelopes": {str(j): b64(e) for j, e in envelopes.items()}}, made, new_pins


def masked_body(
    own: RoundSecrets,
    policy: Policy,
    federation_id: int,
    task: Mapping[str, Any],
    record: RoundRecord,
    update: np.ndarray,
    weight: int,
    metrics: Mapping[str, Any] | None = None,
) -> tuple[bytes, RoundRecord]:
    """The masked upload: the update (flattened, new − global prompt) clipped and quantised with the
    client's own clip and bits, times the weight, plus the self mask and a pairwise mask with each
    neighbour that sent it an envelope; refused below t − 1 envelopes (with fewer pairwise masks, the
    self mask alone would hide the update from a coordinator that later learns its seed)."""
    sa = task.get("secure_aggregation", task)
    envelopes = check_masked(own, federation_id, task, record)
    senders = sorted(int(j) for j in envelopes)
    levels = quantise.weighted(quantise.quantise(update, policy.clip, policy.bits), weight)
    context = protocol.round_context(federation_id, int(task["round"]), int(sa["attempt"]))
    mask_keys = {j: unb64(record["neighbours"][str(j)]["mask_key"], 32) for j in senders}
    vector = protocol.masked_vector(own, record["index"], levels, mask_keys, context)
    metadata = {
        "round": str(task["round"]),
        "attempt": str(sa["attempt"]),
        "index": str(record["index"]),
        "weight": str(weight),
        "metrics": dict(metrics or {}),
    }
    return protocol.encode_masked(vector, metadata), {**record, "envelopes": envelopes}


def check_masked(
    own: RoundSecrets, federation_id: int, task: Mapping[str, Any], record: RoundRecord
) -> dict[str, str]:
    """The masked stage's rules, before any training: this client sent shares in this attempt, the
    task names its number, and it holds envelopes from at least t − 1 of its neighbours (from nobody
    else), each of which opens. The envelopes it will mask with, by sender."""
    sa = task.get("secure_aggregation", task)
    if "t" not in record:
        raise ProtocolError("this client sent no shares in this round attempt; it makes no masked vector")
    if int(sa["index"]) != record["index"]:
        raise ProtocolError(f"the task names number {sa['index']}; this client is number {record['index']}")
    senders = sorted(int(j) for j in sa["envelopes"])
    strangers = set(senders) - {int(j) for j in record["neighbours"]}
    if strangers:
        raise ProtocolError(f"envelopes from {sorted(strangers)}, who are not this client's neighbours")
    t = int(record["t"])
    if len(senders) < t - 1:
        raise ProtocolError(
            f"envelopes from {len(senders)} neighbour(s); this client masks only with at least t − 1 = {t - 1}"
        )
    envelopes = {str(j): str(sa["envelopes"][str(j)]) for j in senders}
    for j, text in envelopes.items():  # one that does not open now would not open at unmasking
        shares.open_envelope(
            own.encryption_private,
            unb64(record["neighbours"][j]["encryption_key"], 32),
            context_of(federation_id, {"round": task["round"], "attempt": sa["attempt"]}),
            int(j),
            record["index"],
            unb64(text),
        )
    return envelopes


def consistency_payload(
    signing_key: bytes, policy: Policy, federation_id: int, task: Mapping[str, Any], record: RoundRecord
) -> tuple[dict[str, str], RoundRecord]:
    """The consistency stage: the signature of the survivor set, signed once per round attempt and only
    when the set is plausible (this client in it, at least max(t, min_survivors), drawn from the
    roster, and every surviving neighbour one it masked with)."""
    if "envelopes" not in record:
        raise ProtocolError("this client made no masked vector in this round attempt")
    _own_index(task, record)
    survivors = sorted({int(j) for j in task["survivors"]})
    if len(survivors) != len(task["survivors"]):
        raise ProtocolError("the survivors repeat a client")
    signed = record.get("survivors")
    if signed is not None and signed != survivors:
        raise ProtocolError(
            f"this client already signed the survivors {signed} for this round attempt; it signs no other set"
        )
    need = max(int(record["t"]), policy.min_survivors)
    if len(survivors) < need:
        raise ProtocolError(f"{len(survivors)} survivor(s) is below max(t, min_clients, 3) = {need}")
    if record["index"] not in survivors:
        raise ProtocolError("this client is not among the survivors")
    outside = set(survivors) - set(record["members"])
    if outside:
        raise ProtocolError(f"survivors {sorted(outside)} are not in the round's roster")
    unmasked = (set(survivors) & {int(j) for j in record["neighbours"]}) - {
        int(j) for j in record["envelopes"]
    }
    if unmasked:
        raise ProtocolError(
            f"neighbours {sorted(unmasked)} are named survivors but sent this client no envelope"
        )
    message = signing.consistency_message(
        context_of(federation_id, task), bytes.fromhex(record["seed"]), survivors
    )
    return {"signature": b64(signing.sign(signing_key, message))}, {**record, "survivors": survivors}


def unmask_payload(
    own: RoundSecrets,
    federation_id: int,
    task: Mapping[str, Any],
    record: RoundRecord,
    revealed: Mapping[str, str],
) -> tuple[dict[str, Any], RoundRecord, Revealed]:
    """The unmasking stage, answered once per round attempt: per neighbour that sent an envelope, the
    share of its seed (survivor) or of its mask key (not a survivor), never both; only for the survivor
    set this client signed, and only once at least t of its neighbours signed that same set."""
    if "survivors" not in record:
        raise ProtocolError("this client signed no survivor set in this round attempt; it reveals nothing")
    _own_index(task, record)
    survivors = sorted({int(j) for j in task["survivors"]})
    if survivors != record["survivors"]:
        raise ProtocolError(
            f"the task names survivors {survivors}; this client signed {record['survivors']}: it reveals nothing"
        )
    if "answer" in record:
        return {"shares": record["answer"]}, record, dict(revealed)
    context = context_of(federation_id, task)
    message = signing.consistency_message(context, bytes.fromhex(record["seed"]), survivors)
    signatures = dict(task.get("signatures", {}))
    valid = 0
    for j, advert in record["neighbours"].items():
        sig = signatures.get(j)
        if sig is None or int(j) not in survivors:
            continue
        raw = protocol.unb64(str(sig))
        if signing.verify(unb64(advert["signing_key"], signing.PUBLIC_BYTES), message, raw):
            valid += 1
        else:
            raise ProtocolError(f"neighbour {j}'s signature is not on the survivor set this client signed")
    t = int(record["t"])
    if valid < t:
        raise ProtocolError(
            f"{valid} neighbour(s) signed this survivor set; this client reveals shares only after t = {t} did"
        )
    out: dict[str, dict[str, str]] = {}
    new_revealed = dict(revealed)
    alive = set(survivors)
    for j, text in sorted(record["envelopes"].items(), key=lambda item: int(item[0])):
        advert = record["neighbours"][j]
        kind = "seed" if int(j) in alive else "key"
        before = new_revealed.get(advert["mask_key"])
        if before is not None and before != kind:
            raise ProtocolError(
                f"this client revealed a {before} share for neighbour {j}'s secrets before; it never reveals "
                "both kinds for one neighbour"
            )
        seed_share, key_share = shares.open_envelope(
            own.encryption_private,
            unb64(advert["encryption_key"], 32),
            context,
            int(j),
            record["index"],
            unb64(text),
        )
        new_revealed[advert["mask_key"]] = kind
        value = seed_share if kind == "seed" else key_share
        out[j] = {"kind": kind, "share": b64(shamir.share_to_bytes(value))}
    return {"shares": out}, {**record, "answer": out}, new_revealed


def _own_index(task: Mapping[str, Any], record: RoundRecord) -> int:
    index = int(task["index"])
    if "index" in record and index != record["index"]:
        raise ProtocolError(f"the task names number {index}; this client is number {record['index']}")
    return index
