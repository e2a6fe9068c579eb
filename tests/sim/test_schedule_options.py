"""simulate's --mode (and the async options that go with it) and --client-speed: parsed and refused
before any process starts, carried into the spec, simulation.json and results.json."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from fedprompt.sim.options import (
    SimulateOptions,
    build_spec,
    check_schedule_options,
    mode_fields,
    parse_client_speed,
)
from fedprompt.sim.outdir import OutState, check_out, recorded_options
from fedprompt.sim.results import run_facts
from fedprompt.sim.simulate import print_schedule, simulate_command
from fedprompt.sim.tables import console


def _options(**over: Any) -> SimulateOptions:
    """simulate's options as the command's defaults make them, with `over` changed."""
    params = inspect.signature(simulate_command).parameters
    return SimulateOptions(**({name: p.default for name, p in params.items()} | over))


def _refusal(**over: Any) -> str:
    with pytest.raises(ValueError) as exc:
        check_schedule_options(_options(**over))
    return str(exc.value)


def _spec(opts: SimulateOptions) -> Any:
    return build_spec(
        dataset_name="sst2", task="sentiment", model="m", clients=opts.clients, fraction=opts.round_fraction,
        rounds=2, local_steps=1, batch_size=2, lr=0.1, num_virtual_tokens=4, max_length=16, seed=0,
        round_deadline=60.0, template="{text} It was [MASK].", verbalizer=[["bad"], ["good"]], hidden_size=8,
        fingerprint=None, mode=mode_fields(opts),
    )  # fmt: skip


# -- --client-speed ---------------------------------------------------------------------------


def test_a_list_of_factors_is_cycled_over_the_clients_in_order() -> None:
    assert parse_client_speed("1,2,4", 5, seed=0) == [1.0, 2.0, 4.0, 1.0, 2.0]
    assert parse_client_speed("3", 2, seed=0) == [3.0, 3.0]
    assert parse_client_speed(" 1.5 , 1", 3, seed=0) == [1.5, 1.0, 1.5]


def test_linear_goes_from_full_speed_for_the_first_client_to_max_for_the_last() -> None:
    assert parse_client_speed("linear:max=4", 4, seed=0) == [1.0, 2.0, 3.0, 4.0]
    assert parse_client_speed("linear:max=2", 3, seed=9) == [1.0, 1.5, 2.0]
    assert parse_client_speed("linear:max=3", 1, seed=0) == [1.0]  # one client: the fastest


def test_lognormal_is_drawn_from_the_seed_and_clipped_to_max() -> None:
    assert parse_client_speed("lognormal:sigma=1,max=5", 6, seed=0) == pytest.approx(
        [2.356994, 1.315924, 1.717227, 5.0, 3.296352, 2.086556]
    )
    assert parse_client_speed("lognormal:sigma=1,max=5", 6, seed=1) == pytest.approx(
        [5.0, 5.0, 2.390625, 1.130017, 1.670754, 1.146771]
    )
    assert parse_client_speed("lognormal:sigma=0,max=5", 2, seed=0) == [1.0, 1.0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1,0.5", "--client-speed '1,0.5': a slowdown factor must be ≥ 1 (1: full speed, 3: three times "
                  "slower); got 0.5"),
        ("1,x", "--client-speed '1,x': 'x' is not a number"),
        ("inf", "--client-speed 'inf': a slowdown factor must be ≥ 1 (1: full speed, 3: three times "
                "slower); got inf"),
        ("", "--client-speed '': give linear:max=M, lognormal:sigma=S,max=M or a list of factors, "
             "e.g. 1,1,2,4"),
        ("fast:max=3", "--client-speed 'fast:max=3': give linear:max=M, lognormal:sigma=S,max=M or a "
                       "list of factors, e.g. 1,1,2,4"),
        ("linear", "--client-speed 'linear': linear takes max, e.g. linear:max=4"),
        ("linear:max=4,min=2", "--client-speed 'linear:max=4,min=2': linear takes max, e.g. linear:max=4"),
        ("linear:max=0.5", "--client-speed 'linear:max=0.5': max must be ≥ 1 (1: full speed, 3: three "
                           "times slower); got 0.5"),
        ("linear:max", "--client-speed 'linear:max': parameters are key=value, e.g. linear:max=4"),
        ("lognormal:max=3", "--client-speed 'lognormal:max=3': lognormal takes sigma and max, e.g. "
                            "lognormal:sigma=1,max=10"),
        ("lognormal:sigma=-1,max=3", "--client-speed 'lognormal:sigma=-1,max=3': sigma must be a "
                                     "number ≥ 0; got -1"),
    ],
)  # fmt: skip
def test_a_bad_client_speed_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_client_speed(text, 4, seed=0)
    assert str(exc.value) == message


def test_a_bad_client_speed_is_refused_with_the_other_options() -> None:
    assert _refusal(client_speed="2,0") == (
        "--client-speed '2,0': a slowdown factor must be ≥ 1 (1: full speed, 3: three times slower); got 0"
    )


def test_the_header_shows_each_clients_slowdown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console, "width", 300)
    with console.capture() as captured:
        print_schedule(_options(clients=3, client_speed="linear:max=2", mode="async", buffer_size=3))
    assert captured.get().splitlines() == [
        "mode async: every client training at once, a version every 3 update(s), updates at most 10 "
        "version(s) stale, server lr 1",
        "--client-speed linear:max=2: slowdown client-0 ×1, client-1 ×1.5, client-2 ×2 (×f: an update goes "
        "up (f − 1) × its training time late)",
    ]
    with console.capture() as captured:
        print_schedule(_options())
    assert captured.get() == ""  # rounds at full speed: the header as before


def test_results_record_the_client_speed_and_the_factors() -> None:
    setup = {
        "federation_id": 1,
        "dataset": "sst2",
        "clients": 2,
        "partition": "iid",
        "client_speed": "1,3",
        "slowdowns": [1.0, 3.0],
    }
    spec = _spec(_options(clients=2)).model_dump(mode="json")
    facts = run_facts(spec, setup, parallel=1, cores=1, device="cpu")
    assert (facts["client_speed"], facts["slowdowns"]) == ("1,3", [1.0, 3.0])
    plain = {k: v for k, v in setup.items() if k not in ("client_speed", "slowdowns")}  # no --client-speed
    older = run_facts(spec, plain, parallel=1, cores=1, device="cpu")
    assert (older["client_speed"], older["slowdowns"]) == (None, None)


# -- --mode -----------------------------------------------------------------------------------


def test_without_fraction_a_run_selects_half_the_clients_in_rounds_and_everyone_in_async() -> None:
    assert _options().fraction == 0.5
    assert _options(fraction=0.2).fraction == 0.2
    assert _options(mode="async").fraction == 1.0


def test_async_passes_only_the_options_given_and_the_spec_fills_in_the_rest() -> None:
    assert mode_fields(_options()) == {}
    opts = _options(mode="async", buffer_size=4, concurrency=3)
    assert mode_fields(opts) == {"mode": "async", "buffer_size": 4, "concurrency": 3}
    spec = _spec(opts)
    assert spec.buffered and spec.fraction == 1.0
    assert (spec.buffer_size, spec.concurrency, spec.max_staleness, spec.server_lr) == (4, 3, 10, 1.0)
    plain = _spec(_options())
    assert not plain.buffered and plain.fraction == 0.5 and plain.buffer_size is None


def test_what_mode_async_cannot_do_is_refused_in_the_options_names() -> None:
    assert _refusal(buffer_size=4, server_lr=0.5) == (
        "--buffer-size, --server-lr: only with --mode async (this run is --mode sync)"
    )
    assert _refusal(mode="async", fraction=0.5) == (
        "--mode async cannot be combined with --fraction 0.5: there is no per-round selection, every client "
        "trains as soon as it asks; leave out --fraction, or limit the clients training at once with "
        "--concurrency"
    )
    assert _refusal(mode="async", secure_aggregation=True) == (
        "--mode async cannot be combined with --secure-aggregation: its masks cancel only in the sum of one "
        "fixed set of clients that started from the same version, and a buffer holds whoever arrives, from "
        "any version"
    )
    assert _refusal(mode="async", drift_correction="scaffold") == (
        "--mode async cannot be combined with --drift-correction scaffold: its control variates assume "
        "every update starts from the round's version; use fedprox"
    )
    assert _refusal(mode="async", server_lr=0.0) == "--server-lr must be in (0, 100]; got 0"
    assert _refusal(mode="fedbuff") == "--mode must be sync or async; got 'fedbuff'"
    check_schedule_options(_options(mode="async", fraction=1.0, drift_correction="fedprox"))


def test_a_folder_from_before_mode_continues_with_the_same_options(tmp_path: Path) -> None:
    """A run recorded fraction 0.5 and none of the new options: the same command, without --fraction,
    continues it."""
    new = ("mode", "concurrency", "buffer_size", "max_staleness", "server_lr", "client_speed")
    before = {k: v for k, v in recorded_options(_options(out=tmp_path)).items() if k not in new}
    assert before["fraction"] == 0.5
    (tmp_path / "simulation.json").write_text(json.dumps({"options": before, "lr": None}))
    assert check_out(_options(out=tmp_path), tmp_path) is OutState.CONTINUE
