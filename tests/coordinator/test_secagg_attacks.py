"""Attacks on secure aggregation by a coordinator that departs from the protocol (or by one client),
against the real coordinator (in process, SQLite) and the real worker stages (worker/secagg.py,
through tests/secagg_clients.py). The test plays the dishonest coordinator by altering the tasks the
real coordinator hands out, or by asking a client what the real coordinator would not; each honest
client must refuse.

1. withholding envelopes so that a client masks with its self mask alone;
2. asking the holders twice, with survivors and dropped swapped (also across a restart);
3. a threshold t = 1, a roster below the minimum, a graph of the coordinator's choosing;
4. a client uploading more than its weighted, clipped update (the coordinator rejects the sum);
plus a round with fewer survivors than max(min_clients, 3), different survivor lists shown to
different clients, and substituted keys.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from fedprompt.coordinator.persistence.db import SecaggMessage, Update
from fedprompt.shared.secagg import client as stages
from fedprompt.shared.secagg import quantise, signing
from fedprompt.shared.secagg.protocol import b64
from fedprompt.worker.secagg import SecureStages
from sqlalchemy import select

from tests.coordinator.conftest import FakeClock
from tests.coordinator.test_secagg_rounds import (
    SA,
    SPEC,
    _drive,
    _expected,
    _federation,
    _rounds,
    _served,
    _version,
)
from tests.helpers import ADMIN_AUTH
from tests.secagg_clients import ScriptedClient


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, FakeClock]]:
    with _served(f"sqlite:///{tmp_path / 'fedprompt.db'}", tmp_path) as served:
        yield served


def _run_until(clients: list[ScriptedClient], done: Callable[[], bool], limit: int = 80) -> None:
    for _ in range(limit):
        if done():
            return
        if not any([c.step() is not None for c in clients]):
            break
    assert done(), "the round did not get there"


def _stage_of(task: dict[str, Any] | None) -> str | None:
    if task is None:
        return None
    return task.get("stage") or ("masked" if "secure_aggregation" in task else task["kind"])


def _at(client: ScriptedClient, stage: str) -> Callable[[], bool]:
    return lambda: _stage_of(client.task()) == stage


def _fresh(client: ScriptedClient) -> SecureStages:
    """The client's stages as a restarted worker has them: everything read back from its folder."""
    return SecureStages(client.state_dir, client.fid, client.client_id, client.stages.policy)


# -- 1. no masked vector without t − 1 pairwise masks ---------------------------------------------


def test_a_client_starved_of_envelopes_makes_no_masked_vector(api) -> None:  # type: ignore[no-untyped-def]
    api, _ = api
    fid, clients = _federation(api)  # 10 clients: k = 4, t = 3
    target = clients[0]
    target.holds.add((1, "masked"))
    _run_until(clients, _at(target, "masked"))
    task = target.task()
    assert task is not None and len(task["secure_aggregation"]["envelopes"]) == 4
    for kept in (0, 1):  # no envelope (its self mask alone), or fewer than t − 1 = 2
        starved = copy.deepcopy(task)
        envelopes = starved["secure_aggregation"]["envelopes"]
        starved["secure_aggregation"]["envelopes"] = dict(list(envelopes.items())[:kept])
        assert target.answer(starved) is None
        assert "at least t − 1 = 2" in target.refused[-1]
    assert not (target.state_dir / "secagg" / "1-1.masked").exists()  # nothing made, nothing sent
    strangers = copy.deepcopy(task)  # an envelope from a client that is not its neighbour
    neighbours = set(strangers["secure_aggregation"]["envelopes"])
    outsider = next(
        str(j) for j in range(1, 11) if str(j) not in neighbours and j != task["secure_aggregation"]["index"]
    )
    strangers["secure_aggregation"]["envelopes"][outsider] = next(
        iter(task["secure_aggregation"]["envelopes"].values())
    )
    assert target.answer(strangers) is None and "not this client's neighbours" in target.refused[-1]
    target.holds.clear()
    assert target.answer(task) == "masked"  # the coordinator's honest task is answered


# -- 2. one answer per round attempt -------------------------------------------------------------


def test_holders_asked_twice_with_the_lists_swapped_reveal_nothing_more(api) -> None:  # type: ignore[no-untyped-def]
    api, _ = api
    fid, clients = _federation(api)
    holder = clients[0]
    holder.holds.add((1, "unmask"))
    _run_until(clients, _at(holder, "unmask"))
    task = holder.task()
    assert task is not None
    first = holder.stages.answer(task)
    assert all(item["kind"] == "seed" for item in first["shares"].values())  # everyone survived
    victim = int(next(iter(first["shares"])))
    swapped = copy.deepcopy(task)  # the victim now "dropped": its key share would undo its masks
    swapped["survivors"] = [j for j in task["survivors"] if j != victim]
    swapped["dropped"] = [victim]
    for kept in (holder.stages, _fresh(holder)):  # also after a restart
        with pytest.raises(ValueError, match="signed"):
            kept.answer(swapped)
        assert kept.answer(task) == first  # the same question: the same answer, nothing new
    holder.holds.clear()
    assert holder.answer(task) == "unmask"
    # the consistency stage's signature is given once too: a second, different set is refused
    record = holder.stages._read(holder.stages._path(1, 1, "record.json"), {})
    again = {**task, "stage": "consistency", "survivors": swapped["survivors"]}
    with pytest.raises(ValueError, match="already signed"):
        _fresh(holder).answer(again)
    assert record["survivors"] == task["survivors"]


def test_a_neighbours_key_share_is_never_followed_by_its_seed_share(tmp_path: Path) -> None:
    # a kept record of an attempt in which neighbour 2 was not a survivor: its key share went out
    record = {"survivors": [1, 3, 4], "index": 1}
    with pytest.raises(ValueError, match="signed"):
        stages.unmask_payload(
            None, 1, {"round": 1, "attempt": 1, "index": 1, "survivors": [1, 2, 3, 4]}, record, {}
        )  # type: ignore[arg-type]
    revealed = {"MASK-KEY-OF-2": "key"}
    full = {
        "survivors": [1, 2, 3],
        "index": 1,
        "t": 2,
        "seed": "00",
        "neighbours": {"2": {"mask_key": "MASK-KEY-OF-2", "signing_key": "", "encryption_key": ""}},
        "envelopes": {"2": ""},
    }
    ask = {"round": 1, "attempt": 2, "index": 1, "survivors": [1, 2, 3], "signatures": {}}
    with pytest.raises(ValueError, match="signed this survivor set"):  # no signatures: refused first
        stages.unmask_payload(None, 1, ask, {**full, "t": 1}, revealed)  # type: ignore[arg-type]


# -- 3. t, the roster and the graph are the client's -------------------------------------------


def test_t_the_roster_and_the_graph_are_checked_by_the_client(api) -> None:  # type: ignore[no-untyped-def]
    api, _ = api
    fid, clients = _federation(api)
    target = clients[0]
    target.holds.add((1, "shares"))
    _run_until(clients, _at(target, "shares"))
    task = target.task()
    assert task is not None and task["t"] == 3 and task["k"] == 4
    one = {**task, "t": 1}  # every share would be the secret itself
    assert target.answer(one) is None and "below this client's rule t = 3" in target.refused[-1]
    own = str(task["index"])
    small = {
        **task,
        "roster": {j: e for j, e in task["roster"].items() if j == own or j in task["neighbours"]},
    }
    small["roster"] = dict(list(small["roster"].items())[:4])
    small["roster"][own] = task["roster"][own]
    assert target.answer(small) is None and "below this federation's minimum of 5" in target.refused[-1]
    # a graph of the coordinator's choosing: one neighbour swapped for another client
    others = [j for j in task["roster"] if j != own and j not in task["neighbours"]]
    chosen = copy.deepcopy(task)
    gone = next(iter(chosen["neighbours"]))
    del chosen["neighbours"][gone]
    chosen["neighbours"][others[0]] = {
        "client_id": task["roster"][others[0]]["client_id"],
        **_advert_of(api, fid, others[0]),
    }
    assert target.answer(chosen) is None and "the roster's graph gives" in target.refused[-1]
    target.holds.clear()
    assert target.answer(task) == "shares"


def _advert_of(api: TestClient, fid: int, number: str) -> dict[str, str]:
    """A client's advertisement as the coordinator stored it (numbers follow client ids)."""
    with api.app.state.service.store.sessions() as s:
        rows = s.execute(
            select(SecaggMessage.sender_id, SecaggMessage.payload).where(SecaggMessage.stage == "keys")
        ).all()
    adverts = {cid: json.loads(p) for cid, p in rows}
    plan_indices = sorted(adverts)
    return adverts[plan_indices[int(number) - 1]]


# -- 4. the unmasked sum is bounded --------------------------------------------------------------


def test_a_sum_beyond_clipping_is_rejected_and_named(api, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    api, clock = api
    fid, clients = _federation(api)
    cheat = clients[3]
    cheat.holds.add((1, "masked"))
    _run_until(clients, _at(cheat, "masked"))
    honest = quantise.weighted

    def boosted(q: np.ndarray, weight: int) -> np.ndarray:  # levels far beyond 2^bits − 1
        return honest(q, weight) + np.uint64(2**40)

    monkeypatch.setattr(quantise, "weighted", boosted)
    task = cheat.task()
    assert task is not None and cheat.answer(task) == "masked"
    monkeypatch.setattr(quantise, "weighted", honest)
    cheat.holds.clear()
    _drive(api, clients, fid, clock, until=1)
    first = _rounds(api, fid)[0]
    assert first["state"] == "failed"
    assert "outside what clipping allows in 32 of 32 element(s)" in first["failure_reason"]
    assert first["stats"]["secure_aggregation"]["rejected"] in first["failure_reason"]
    # the retried attempt, with every client honest, is FedAvg within the bound
    got = _version(api, fid, 1)
    assert (
        np.abs(got - _expected(api, fid, clients)).max()
        <= quantise.error_bound(SA["clip"], SA["bits"]) + 1e-6
    )


# -- the floor of survivors ----------------------------------------------------------------------


def test_two_survivors_of_three_never_close_a_round(api) -> None:  # type: ignore[no-untyped-def]
    api, clock = api
    spec = {**SPEC, "min_clients": 3, "expected_clients": 3, "quorum": 1}
    fid, clients = _federation(api, n=3, spec=spec)
    clients[2].stop_after = "shares"  # masked vectors from two clients only
    for _ in range(20):
        if not any([c.step() is not None for c in clients]):
            break
    clock.advance(61)
    api.app.state.service.cycle.sweep()
    first = _rounds(api, fid)[0]
    assert first["state"] == "failed" and "of 3" in first["failure_reason"]
    assert api.get(f"/api/v1/federations/{fid}", headers=ADMIN_AUTH).json()["latest_version"] == 0


# -- the consistency check ------------------------------------------------------------------------


def test_different_survivor_lists_for_different_clients_are_refused(api) -> None:  # type: ignore[no-untyped-def]
    api, _ = api
    fid, clients = _federation(api)
    misled = clients[0]
    misled.holds.add((1, "consistency"))
    _run_until(clients, _at(misled, "consistency"))
    task = misled.task()
    assert task is not None
    record = misled.stages._read(misled.stages._path(1, 1, "record.json"), {})
    victim = int(next(iter(record["neighbours"])))
    # the misled client is told its neighbour `victim` did not survive; the others were told it did
    lie = {**task, "survivors": [j for j in task["survivors"] if j != victim]}
    misled.stages.answer(lie)  # a plausible set: it signs it (once)
    others = [c for c in clients if c is not misled]
    _run_until(others, lambda: all((1, "consistency") in c.done for c in others))
    with api.app.state.service.store.sessions() as s:
        rows = s.execute(
            select(SecaggMessage.sender_id, SecaggMessage.payload).where(SecaggMessage.stage == "consistency")
        ).all()
    number_of = {c.client_id: i + 1 for i, c in enumerate(sorted(clients, key=lambda c: c.client_id))}
    signatures = {str(number_of[cid]): json.loads(p)["signature"] for cid, p in rows}
    ask = {
        **task,
        "stage": "unmask",
        "survivors": lie["survivors"],
        "dropped": [victim],
        "signatures": signatures,
    }
    with pytest.raises(ValueError, match="not on the survivor set this client signed"):
        misled.stages.answer(ask)  # its neighbours signed the true set
    with pytest.raises(ValueError, match="0 neighbour"):
        misled.stages.answer({**ask, "signatures": {}})
    # the honest coordinator takes no signature on another set either
    forged = api.post(
        f"/api/v1/federations/{fid}/rounds/1/secagg/consistency",
        json=misled.stages.answer(lie),
        headers=misled.headers,
    )
    assert forged.status_code == 422 and "survivor set" in forged.json()["detail"]


# -- substituted keys ------------------------------------------------------------------------------


def test_a_substituted_public_key_is_detected(api) -> None:  # type: ignore[no-untyped-def]
    api, clock = api
    fid, clients = _federation(api)
    _drive(api, clients, fid, clock, until=1)  # round 1: every client pins its neighbours' keys
    target = clients[0]
    target.holds.add((2, "shares"))
    _run_until(clients, _at(target, "shares"))
    task = target.task()
    assert task is not None
    j = next(iter(task["neighbours"]))
    # (a) a neighbour's mask key replaced by one the coordinator holds: not what the roster lists
    fake_key = b64(bytes(range(32)))
    swapped = copy.deepcopy(task)
    swapped["neighbours"][j]["mask_key"] = fake_key
    assert target.answer(swapped) is None and "differ from the roster" in target.refused[-1]
    # (b) the roster rewritten to match: the advertisement is not signed by the neighbour's key
    context = f"federation={fid};round=2;attempt=1".encode()
    resigned = copy.deepcopy(swapped)
    cid = int(task["neighbours"][j]["client_id"])
    fields = {f: resigned["neighbours"][j][f] for f in signing.ADVERT_FIELDS}
    resigned["roster"][j]["digest"] = signing.roster_digest(cid, fields)
    assert target.answer(resigned) is None
    assert "not signed by its signing key" in target.refused[-1] or "graph" in target.refused[-1]
    # (c) a whole new identity for the neighbour, signed by a key of the coordinator's, roster and all:
    # every client pinned every member's signing key in round 1
    impostor = signing.new_signing_key()
    fields["signing_key"] = b64(signing.public_key(impostor))
    fields["signature"] = b64(signing.sign(impostor, signing.keys_message(context, int(j), cid, fields)))
    forged = copy.deepcopy(swapped)
    forged["neighbours"][j].update(fields)
    forged["roster"][j].update(signing_key=fields["signing_key"], digest=signing.roster_digest(cid, fields))
    assert target.answer(forged) is None and "other than the one this client pinned" in target.refused[-1]
    with pytest.raises(ValueError, match="pinned"):
        stages.check_advert(
            context, int(j), cid, fields, target.stages._read(target.stages.dir / "pins.json", {})
        )
    # and the coordinator refuses a client's keys under another signing key than its pinned one
    other = SecureStages(target.state_dir / "other", fid, target.client_id, target.stages.policy)
    keys_task = {"stage": "keys", "round": 2, "attempt": 1, "index": task["index"]}
    answer = api.post(
        f"/api/v1/federations/{fid}/rounds/2/secagg/keys",
        json=other.answer(keys_task),
        headers=target.headers,
    )
    assert answer.status_code == 409 and "cannot be replaced" in answer.json()["detail"]


def test_a_weight_beyond_the_enrolled_samples_is_refused(api) -> None:  # type: ignore[no-untyped-def]
    api, _ = api
    fid, clients = _federation(api)
    greedy = clients[5]
    greedy.holds.add((1, "masked"))
    _run_until(clients, _at(greedy, "masked"))
    task = greedy.task()
    assert task is not None
    body = greedy.stages.masked(task, greedy.update, greedy.weight + 1, {})  # one more than it enrolled
    url = f"/api/v1/federations/{fid}/rounds/1/update"
    refused = api.put(url, content=body, headers=greedy.headers)
    assert refused.status_code == 422 and refused.headers["content-type"].startswith(
        "application/problem+json"
    )
    assert f"exceeds the {greedy.weight} samples" in refused.json()["detail"]
    with api.app.state.service.store.sessions() as s:
        assert s.scalars(select(SecaggMessage.id).where(SecaggMessage.sender_id == greedy.client_id)).all()
        assert not s.execute(select(Update.id).where(Update.client_id == greedy.client_id)).all()


# -- the unmasking answer is whole or refused -----------------------------------------------------


def test_a_partial_or_empty_unmasking_answer_is_refused_and_the_complete_one_taken(api) -> None:  # type: ignore[no-untyped-def]
    api, clock = api
    fid, clients = _federation(api)
    first = clients[0]
    first.holds.add((1, "unmask"))
    _run_until(clients, _at(first, "unmask"))
    task = first.task()
    assert task is not None
    honest = first.stages.answer(task)
    assert len(honest["shares"]) >= 2
    url = f"/api/v1/federations/{fid}/rounds/1/secagg/unmask"
    partial = {"shares": dict(list(honest["shares"].items())[:-1])}
    for payload in (partial, {"shares": {}}):
        refused = api.post(url, json=payload, headers=first.headers)
        assert refused.status_code == 422, refused.text
        assert "lacks the shares" in refused.json()["detail"]
    with api.app.state.service.store.sessions() as s:
        stored = s.scalars(
            select(SecaggMessage).where(
                SecaggMessage.stage == "unmask", SecaggMessage.sender_id == first.client_id
            )
        ).all()
    assert stored == []  # nothing of the refused answers was kept
    taken = api.post(url, json=honest, headers=first.headers)
    assert taken.status_code == 201, taken.text
    first.holds.clear()
    _drive(api, clients, fid, clock, until=1)
    bound = quantise.error_bound(SA["clip"], SA["bits"])
    assert np.abs(_version(api, fid, 1) - _expected(api, fid, clients)).max() <= bound + 1e-6
