"""A worker whose coordinator stays unreachable: retries with backoff, then one line and exit code 1
(`fedprompt-worker serve --give-up-after`), instead of a long traceback and a process doing nothing."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fedprompt.worker.agent import IDLE, WorkerStatus
from fedprompt.worker.joining import FatalWorkerError
from fedprompt.worker.pool import Pool, _run_agent
from fedprompt.worker.reach import Unreachable, backoff, wait_reachable

WORKER = str(Path(sys.executable).parent / "fedprompt-worker")
URL = "http://127.0.0.1:9"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_backoff_doubles_up_to_a_cap() -> None:
    assert [backoff(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


def test_wait_reachable_retries_then_gives_up_with_one_line() -> None:
    clock, calls = FakeClock(), []

    def probe(url: str) -> Any:
        calls.append(clock.now)
        raise httpx.ConnectError("[Errno 111] Connection refused")

    with pytest.raises(Unreachable) as caught:
        wait_reachable(URL, 20.0, probe=probe, clock=clock, sleep=clock.sleep)

    assert calls == [0, 1, 3, 7, 15, 20]  # backoff 1, 2, 4, 8, then what is left
    message = str(caught.value)
    assert "\n" not in message and f"the coordinator at {URL} stayed unreachable for 20 s" in message
    assert "ConnectError: [Errno 111] Connection refused" in message and "--give-up-after" in message


def test_wait_reachable_accepts_any_answer_below_500() -> None:
    answers = iter([SimpleNamespace(status_code=503), SimpleNamespace(status_code=404)])
    clock = FakeClock()

    assert wait_reachable(URL, 60.0, probe=lambda _: next(answers), clock=clock, sleep=clock.sleep)
    assert clock.now == 1


class FakeAgent:
    """An agent whose run() raises the given exceptions in turn, then returns."""

    def __init__(self, *outcomes: BaseException | None) -> None:
        self.outcomes = list(outcomes)
        self.config = SimpleNamespace(name="site-0", coordinator=URL)
        self.status = WorkerStatus()
        self.runs = 0
        self.stopped = threading.Event()

    @property
    def stopping(self) -> bool:
        return self.stopped.is_set()

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        self.runs += 1
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome is not None:
            raise outcome


def test_a_client_is_restarted_while_the_coordinator_is_away_then_given_up() -> None:
    agent = FakeAgent(*[httpx.ConnectError("refused")] * 100)
    fatal: list[str] = []

    _run_agent(agent, give_up_after=1.5, on_fatal=fatal.append)  # type: ignore[arg-type]

    assert agent.runs >= 2 and agent.status.state == "error"
    (message,) = fatal
    assert message.startswith(f"the coordinator at {URL} stayed unreachable for ")


def test_a_client_that_reconnects_runs_on() -> None:
    agent = FakeAgent(httpx.ConnectError("refused"), None)
    fatal: list[str] = []

    _run_agent(agent, give_up_after=30.0, on_fatal=fatal.append)  # type: ignore[arg-type]

    assert agent.runs == 2 and fatal == []


def test_a_fatal_agent_error_is_one_line_for_the_service(caplog: pytest.LogCaptureFixture) -> None:
    agent = FakeAgent(FatalWorkerError("enrolment refused: 403 the token is spent"))
    fatal: list[str] = []

    _run_agent(agent, give_up_after=30.0, on_fatal=fatal.append)  # type: ignore[arg-type]

    assert fatal == ["enrolment refused: 403 the token is spent"] and agent.runs == 1
    assert not any(r.exc_info for r in caplog.records)  # no traceback


def test_without_give_up_a_pool_keeps_its_other_clients_up() -> None:
    agent = FakeAgent(httpx.ConnectError("refused"))

    _run_agent(agent)  # type: ignore[arg-type]

    assert agent.runs == 1 and agent.status.state == "error"


def test_stopping_the_pool_ends_a_waiting_restart() -> None:
    agent = FakeAgent(*[httpx.ConnectError("refused")] * 100)
    pool = Pool([agent], give_up_after=600.0, on_fatal=lambda _: None)  # type: ignore[list-item]
    pool.start()
    pool.stop(timeout=5.0)
    assert pool.alive() == 0


class PollingAgent(FakeAgent):
    """An idle agent blocked in a task long-poll that no stop() interrupts, or one at work that stops."""

    def __init__(self, state: str) -> None:
        super().__init__()
        self.status.state = state
        self.released = threading.Event()

    def run(self) -> None:
        self.runs += 1
        if self.status.state == IDLE:
            self.released.wait(600)  # the poll returns when the coordinator answers
        else:
            self.stopped.wait(600)  # training: the next step sees the stop


def test_stopping_the_pool_waits_for_clients_at_work_not_for_a_long_poll() -> None:
    polling, training = PollingAgent(IDLE), PollingAgent("training")
    pool = Pool([polling, training])  # type: ignore[list-item]
    pool.start()
    stopper = threading.Thread(target=pool.stop, kwargs={"timeout": 600.0})
    stopper.start()
    stopper.join(30.0)
    assert not stopper.is_alive()  # it did not wait out the 600 s poll
    assert pool._threads[1].is_alive() is False  # the training client's thread was waited for
    assert pool._threads[0].is_alive()  # the polling one is left to end with the process
    polling.released.set()


def test_serve_exits_1_with_one_line_when_the_coordinator_stays_unreachable(tmp_path: Path) -> None:
    data = tmp_path / "mine.csv"
    data.write_text("text,label\n" + "".join(f"row {i},{'ab'[i % 2]}\n" for i in range(20)))
    args = [
        WORKER, "serve", "--coordinator", URL, "--federation", "1", "--data", str(data),
        "--enrollment-token", "fpe_x", "--state-dir", str(tmp_path / "state"), "--give-up-after", "2",
        "--port", "0", "--log-format", "json",
    ]  # fmt: skip

    done = subprocess.run(args, capture_output=True, text=True, timeout=120)

    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) <= 3  # the retry warnings (a repeated one is logged once), then the error
    assert lines[-1:] == [
        f"error: the coordinator at {URL} stayed unreachable for 2 s (ConnectError: [Errno 111] Connection "
        "refused); giving up (check --coordinator and that the coordinator runs; --give-up-after sets how "
        "long to wait)"
    ]
    assert "Traceback" not in done.stdout + done.stderr
