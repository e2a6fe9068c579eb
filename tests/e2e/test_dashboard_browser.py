"""The dashboard in headless Chromium against a real coordinator process.

Simulated sites (plain REST clients: random prompts, synthetic metrics) move a federation through
its rounds while the page is open: the page must follow without a reload, and its "close round"
button must close the round through the REST API. The screenshot is a test artifact: it goes to
runs/test-artifacts/ (or FEDPROMPT_TEST_ARTIFACTS), and to docs/dashboard.png (docs/dashboard.md shows it)
when FEDPROMPT_UPDATE_DOCS=1.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fedprompt.shared.client import CoordinatorClient
from playwright.sync_api import Browser, Page, expect, sync_playwright
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import ADMIN, coordinator_process, update_blob, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SPEC: dict[str, Any] = {
    "name": "sst2-hospitals",
    "num_virtual_tokens": 20,
    "hidden_size": 384,
    "rounds": 6,
    "fraction": 1.0,
    "min_clients": 3,
    "quorum": 1,
    "round_deadline_s": 600,
    "params_full_model": 22_713_216,  # all-MiniLM-L6-v2, as simulate records it from the model it loads
}
SITES = [("hospital-a", 1200), ("hospital-b", 800), ("hospital-c", 400)]
MINILM_PARAMETERS = 22_713_216
# Synthetic per-version metrics the simulated sites report: (accuracy, loss, attack success rate).
CURVE = [(0.51, 0.81, 0.12), (0.63, 0.69, 0.11), (0.72, 0.58, 0.10), (0.78, 0.50, 0.10)]


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Debian's Chromium driven by Playwright (never `playwright install`)."""
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)"
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Sites:
    """Three simulated sites that download the global prompt, upload updates and report metrics."""

    def __init__(self, admin: CoordinatorClient, fid: int) -> None:
        token = admin.create_enrollment_token(fid, max_uses=len(SITES))
        self.admin = admin
        self.fid = fid
        self.clients: list[CoordinatorClient] = []
        for name, samples in SITES:
            enrolled = admin.enroll(fid, token, name=name, num_samples=samples, info={})
            self.clients.append(admin.with_token(enrolled.token))

    def upload(self, number: int, which: list[int]) -> None:
        """Sites `which` train round `number` (download its base prompt, upload a random update)."""
        for i in which:
            c = self.clients[i]
            c.prompt(self.fid, number - 1)
            blob = update_blob(
                SPEC,
                seed=100 * number + i,
                num_samples=SITES[i][1],
                base_version=number - 1,
                metrics={"loss": CURVE[min(number, len(CURVE) - 1)][1] + 0.05 * i},
            )
            status, _ = c.upload(self.fid, number, blob)
            assert status == 201

    def evaluate(self, version: int) -> None:
        """Every site reports the synthetic metrics of a prompt version (once the round has aggregated)."""
        # The last upload closes the round in a background task: wait for the version to exist.
        wait_for(
            lambda: self.admin.federation(self.fid).latest_version >= version,
            30,
            f"prompt version {version}",
        )
        acc, loss, asr = CURVE[min(version, len(CURVE) - 1)]
        for i, c in enumerate(self.clients):
            report = {
                "version": version,
                "num_samples": 100,
                "accuracy": acc - 0.02 * i,
                "loss": loss + 0.03 * i,
                "metrics": {"asr": asr},
            }
            c.report_evaluation(self.fid, version, report)

    def close(self) -> None:
        """Close the HTTP clients."""
        for c in self.clients:
            c.close()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The coordinator's /metrics as {(sample name, labels): value}."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def save_screenshot(page: Page, tmp_path: Path, name: str = "dashboard.png") -> Path:
    """Full-page screenshot into the artifacts folder (and docs/ when FEDPROMPT_UPDATE_DOCS=1)."""
    shot = tmp_path / name
    page.screenshot(path=str(shot), full_page=True)
    png = shot.read_bytes()
    artifacts = Path(os.environ.get("FEDPROMPT_TEST_ARTIFACTS") or ROOT / "runs" / "test-artifacts")
    artifacts.mkdir(parents=True, exist_ok=True)
    (artifacts / name).write_bytes(png)
    if os.environ.get("FEDPROMPT_UPDATE_DOCS") == "1":
        (ROOT / "docs" / name).write_bytes(png)
    return shot


def logged_in(browser: Browser, url: str) -> tuple[Any, Page, list[str]]:
    """A new browser context logged in to the dashboard: (context, page, page errors seen)."""
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.goto(f"{url}/dashboard/login")
    page.fill("#token", ADMIN)
    page.click("button[type=submit]")
    return context, page, problems


def test_dashboard_follows_rounds_live_and_closes_a_round(browser: Browser, tmp_path: Path) -> None:
    # Prepare: a real coordinator, a federation with three enrolled sites; round 1 opens by itself
    with coordinator_process(f"sqlite:///{tmp_path / 'dash.db'}", tmp_path) as (url, _):
        admin = CoordinatorClient(url, ADMIN)
        fid = admin.create_federation(SPEC).id
        sites = Sites(admin, fid)
        sites.evaluate(0)
        # The other federation's spec leaves the model's size out: its worker states it at enrolment
        unsized = {k: v for k, v in SPEC.items() if k != "params_full_model"}
        other = admin.create_federation({**unsized, "name": "agnews-banks", "min_clients": 2}).id
        bank_token = admin.create_enrollment_token(other, max_uses=1)
        admin.enroll(
            other, bank_token, name="bank-a", num_samples=500, info={}, model_parameters=MINILM_PARAMETERS
        )
        assert admin.federation(other).spec["params_full_model"] is None
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        page = context.new_page()
        problems: list[str] = []
        page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)

        # Execute: log in through the form
        page.goto(f"{url}/dashboard")
        expect(page).to_have_url(f"{url}/dashboard/login")
        page.fill("#token", ADMIN)
        page.click("button[type=submit]")
        expect(page).to_have_url(f"{url}/dashboard")
        head = page.locator("#fed-head")
        expect(head).to_contain_text(SPEC["name"])
        expect(page.locator("[data-current-round]")).to_have_text("1 / 6")

        # Assert: the prompt's share of the model, from the federation's ledger (20 × 384 of 22.7 M)
        ratio = page.locator("[data-comm-ratio]")
        expect(ratio).to_contain_text("0.0338 % of 22,713,216 parameters")
        expect(page.locator("#fed-comm")).to_contain_text("prompt_tuning: 20 × 384 = 7,680 parameters")

        # Assert: the token is nowhere but in an HttpOnly, SameSite=Strict cookie derived from it
        cookies = {c["name"]: c for c in context.cookies()}
        session = cookies["fedprompt_session"]
        assert session["httpOnly"] and session["sameSite"] == "Strict" and session["path"] == "/"
        assert ADMIN not in session["value"]
        assert ADMIN not in page.content() and ADMIN not in page.url
        assert page.evaluate("document.cookie") == ""

        # Execute: two rounds complete while the page stays open (marker: no reload happens)
        page.evaluate("window.__noReload = 'still here'")
        for number in (1, 2):
            sites.upload(number, [0, 1, 2])
            sites.evaluate(number)

        # Assert: the page shows round 3 and the closed rounds, without reloading
        expect(page.locator("[data-current-round]")).to_have_text("3 / 6", timeout=15_000)
        expect(page.locator('#fed-timeline tr[data-round="2"][data-state="closed"]')).to_be_visible()
        assert page.evaluate("window.__noReload") == "still here"

        # Execute: two of three sites upload round 3, then the operator closes it from the page
        sites.upload(3, [0, 1])
        expect(page.locator("[data-uploaded]")).to_have_text("2 / 3", timeout=15_000)
        page.click('button[data-action="close-round"]')
        dialog = page.locator("dialog#confirm")
        expect(dialog).to_be_visible()
        expect(dialog).to_contain_text("Close round 3")
        page.click("#confirm-ok")

        # Assert: round 3 closed by the operator, round 4 open, on the page and in the API
        expect(page.locator('#fed-timeline tr[data-round="3"][data-state="closed"]')).to_be_visible(
            timeout=15_000
        )
        expect(page.locator("[data-current-round]")).to_have_text("4 / 6", timeout=15_000)
        expect(page.locator("#flash")).to_contain_text("Close round 3: done")
        assert admin.rounds(fid)[2]["closed_by"] == "operator"
        assert page.evaluate("window.__noReload") == "still here"

        # Cancelling a confirmation does nothing: the client stays enrolled
        page.click('tr[data-client="3"] button[data-action="revoke"]')
        expect(dialog).to_contain_text("Revoke client 3 'hospital-c'?")
        page.click("#confirm-cancel")
        expect(dialog).to_be_hidden()
        assert [c["revoked"] for c in admin.clients(fid)] == [False, False, False]

        # Switching federations happens in place too
        page.click(f'[data-select-federation="{other}"]')
        expect(head).to_contain_text("agnews-banks")
        expect(page).to_have_url(f"{url}/dashboard?federation={other}")
        expect(page.locator("#chart-accuracy")).to_contain_text("no closed round yet")
        # Its ratio comes from the size its worker stated at enrolment, not from the spec
        expect(ratio).to_contain_text("0.0338 % of 22,713,216 parameters")
        expect(ratio).to_contain_text("as an enrolled worker stated its model")
        assert admin.federation(other).model_extra["ledger"]["params_full_model"] == MINILM_PARAMETERS
        page.click(f'[data-select-federation="{fid}"]')
        expect(head).to_contain_text(SPEC["name"])
        assert page.evaluate("window.__noReload") == "still here"

        # The charts take the new evaluation; then the screenshot for docs/dashboard.md
        sites.evaluate(3)
        expect(page.locator("#fed-timeline tr[data-round='3'] td").nth(8)).not_to_have_text(
            "—", timeout=15_000
        )
        page.wait_for_function("document.querySelectorAll('#charts .uplot').length === 4")
        shot = save_screenshot(page, tmp_path)
        assert shot.stat().st_size > 20_000
        assert problems == [], problems

        # The same federation in /metrics: 3 rounds closed, 4 opened, 8 uploads accepted
        samples = scrape(url)
        assert samples[("fedprompt_rounds_total", (("state", "closed"),))] == 3
        assert samples[("fedprompt_rounds_total", (("state", "open"),))] == 4
        assert samples[("fedprompt_uploads_total", (("result", "accepted"),))] == 8
        assert samples[("fedprompt_active_clients", (("federation", str(fid)),))] == 3
        context.close()
        sites.close()
        admin.close()

    # The coordinator's stderr went to a file, so its log is JSON lines, round events included
    log_file = tmp_path / f"coordinator-{url.rsplit(':', 1)[1]}.log"
    events = [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]
    closed = [e for e in events if e["event"] == "round_closed" and e["federation_id"] == fid]
    assert [(e["round"], e["closed_by"]) for e in closed] == [
        (1, "all-uploaded"),
        (2, "all-uploaded"),
        (3, "operator"),
    ]
    # The operator's close carries its request's id; an all-uploaded close is made by the last
    # upload's request or, when the sweeper gets there first, by the background sweep (no request).
    assert closed[-1].get("request_id")


def test_site_health_the_per_site_table_and_a_first_version_on_the_page(
    browser: Browser, tmp_path: Path
) -> None:
    """A site that stops mid-training (its heartbeats stop, as when its worker is killed) is shown
    stale after three missed heartbeats, a site whose heartbeat says it trains is shown training;
    the per-site table shows each site's accuracy; with only the initial prompt evaluated the charts
    keep a one-version window and the bytes axis reads whole bytes."""
    # 30 s availability timeout: heartbeats every 3 s, stale after 9 s of silence
    spec = {**SPEC, "name": "site-health", "availability_timeout_s": 30, "rounds": 3}
    with coordinator_process(f"sqlite:///{tmp_path / 'health.db'}", tmp_path) as (url, _):
        admin = CoordinatorClient(url, ADMIN)
        fid = admin.create_federation(spec).id
        sites = Sites(admin, fid)  # round 1 opens with the three sites
        sites.evaluate(0)
        killed, busy, idle = sites.clients
        killed.activity(fid, {"phase": "training", "round": 1, "step": 10, "total_steps": 100})
        wait_for(
            lambda: {c["name"]: c["state"] for c in admin.clients(fid)}["hospital-a"] == "stale",
            30,
            "hospital-a shown stale",
        )
        busy.activity(fid, {"phase": "training", "round": 1, "step": 40, "total_steps": 100})
        idle.task(fid)
        context, page, problems = logged_in(browser, url)
        expect(page.locator("#fed-head")).to_contain_text("site-health")

        statuses = page.locator("tr[data-client] [title]")
        expect(page.locator('tr[data-client="1"]')).to_have_attribute("data-client-status", "stale")
        expect(page.locator('tr[data-client="2"]')).to_have_attribute("data-client-status", "training")
        expect(page.locator('tr[data-client="3"]')).to_have_attribute("data-client-status", "live")
        assert statuses.count() >= 3
        expect(page.locator("[data-site-states]")).to_contain_text("1 live · 1 training · 1 stale")
        table = page.locator("[data-site-table]")
        expect(table).to_contain_text("hospital-c")
        expect(table).to_contain_text("v0")

        page.wait_for_function("document.querySelectorAll('#charts .uplot').length === 4")
        save_screenshot(page, tmp_path, "dashboard-site-health.png")
        # one version evaluated: a window of one version around 0, not uPlot's default 0..100; bytes
        # from 0 to 1 KiB while nothing has been sent (whole-byte ticks only)
        assert page.locator("#chart-accuracy").get_attribute("data-x") == "-0.5,0.5"
        assert page.locator("#chart-bytes").get_attribute("data-y") == "0,1024"
        assert problems == [], problems
        context.close()
        sites.close()
        admin.close()


def test_a_secure_round_with_a_drop_at_each_stage_on_the_page(browser: Browser, tmp_path: Path) -> None:
    """Twelve sites in a secure round (the real worker stages, driven by hand) with one site dropping
    after each of keys, shares, masked and consistency, and one never answering: the page names each dropped site and the
    stage it did not complete, and counts the answers per stage."""
    from tests.secagg_clients import ScriptedClient

    spec = {
        **SPEC,
        "name": "secure-hospitals",
        "min_clients": 5,
        "expected_clients": 12,
        "rounds": 2,
        "round_deadline_s": 30,
        # every site a neighbour of every other, so that five drops leave each secret enough shares
        "secure_aggregation": {
            "clip": 1.0,
            "bits": 20,
            "threshold": 0.5,
            "stage_deadline_s": 8,
            "neighbours": 11,
        },
    }
    names = [f"site-{i}" for i in range(12)]
    with (
        coordinator_process(f"sqlite:///{tmp_path / 'secure.db'}", tmp_path) as (url, _),
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        admin = CoordinatorClient(url, ADMIN)
        fid = admin.create_federation(spec).id
        token = admin.create_enrollment_token(fid, max_uses=12)
        clients = []
        for i, name in enumerate(names):
            got = admin.enroll(fid, token, name=name, num_samples=20, info={})
            update = np.random.default_rng(i).uniform(-0.4, 0.4, 20 * 384)
            clients.append(ScriptedClient(http, fid, got.client_id, got.token, update, 20, seed=i))
        for i, stage in ((1, "keys"), (4, "shares"), (7, "masked"), (8, "consistency")):
            clients[i].stop_after = stage
        clients[9].holds.add((1, "keys"))  # never answers round 1 at all: dropped at keys
        wait_for(lambda: admin.federation(fid).current_round == 1, 30, "round 1")

        def step() -> bool:
            if admin.federation(fid).latest_version >= 1:
                return True
            for c in clients:
                c.step()
            return False

        wait_for(step, 120, "round 1 aggregated with four sites dropped")
        context, page, problems = logged_in(browser, url)
        expect(page.locator("#fed-head")).to_contain_text("secure-hospitals")
        assert [r["state"] for r in admin.rounds(fid)][:1] == ["closed"]  # its first attempt
        row = page.locator('#fed-timeline tr[data-round="1"][data-attempt="1"]')
        expect(row).to_contain_text("keys 11 → shares 10 → masked 9 → consistency 8 → unmask 7")
        drops = row.locator("[data-secure-drop]")
        assert drops.all_inner_texts() == [
            "site-1 dropped at shares",
            "site-4 dropped at masked",
            "site-7 dropped at consistency",
            "site-8 dropped at unmask",
            "site-9 dropped at keys",
        ]
        save_screenshot(page, tmp_path, "dashboard-secure-round.png")
        scrape = httpx.get(f"{url}/metrics", timeout=10).text
        for stage in ("keys", "shares", "masked", "consistency", "unmask"):
            assert f'fedprompt_secagg_dropped{{federation="{fid}",stage="{stage}"}} 1.0' in scrape
        assert problems == [], problems
        context.close()
        admin.close()
