"""The web console in a real browser: Debian's Chromium, headless, driven by Playwright, against
`tether serve` on 127.0.0.1. Every request that is not to the server is aborted, and any console
error or page error fails the test. Screenshots go to .ci/artifacts/console/ (kept by CI)."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dbos")
pytest.importorskip("jinja2")
sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (CI installs it)")

from hang import HANG  # noqa: E402
from test_console import api_key, running  # noqa: E402
from test_service import Service, wait_status  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip("the browser tests need Debian's chromium (apt-get install chromium; CI installs it)",
                allow_module_level=True)
ARTIFACTS = Path(__file__).resolve().parents[1] / ".ci" / "artifacts" / "console"
HANG_MS = HANG * 1000  # Playwright's waits end on what they wait for; this only catches a hang
sync_api.expect.set_options(timeout=HANG_MS)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(tmp_path)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


class Tab:
    """A browser tab on the service: only the service is reachable, and every console error is kept."""

    def __init__(self, browser: Any, service: Service, name: str) -> None:
        self.context = browser.new_context()
        self.context.set_default_timeout(HANG_MS)
        self.page = self.context.new_page()
        self.base, self.name, self.errors, self.aborted = service.url, name, [], []
        self.page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("dialog", lambda d: (self.errors.append(f"dialog: {d.message}"), d.dismiss()))
        self.context.route("**/*", self._only_the_service)

    def _only_the_service(self, route: Any) -> None:
        url = route.request.url
        if url.startswith(self.base + "/"):
            route.continue_()
        else:
            self.aborted.append(url)
            route.abort()

    def login(self, key: str) -> None:
        self.page.goto(self.base + "/runs")
        assert self.page.url.endswith("/login")
        self.page.fill("input[name=key]", key)
        self.page.click("#login")
        self.page.wait_for_url(self.base + "/runs")

    def start(self, agent: str, prompt: str) -> str:
        self.page.goto(self.base + "/runs/new")
        self.page.select_option("select[name=agent]", agent)
        self.page.fill("textarea[name=prompt]", prompt)
        self.page.click("#start")
        self.page.wait_for_url(re.compile(r".*/runs/t_[^/]+$"))
        return self.page.url.rsplit("/", 1)[1]

    def shot(self, what: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{self.name}-{what}.png"), full_page=True)

    def close(self) -> None:
        self.context.close()
        assert not self.errors, self.errors


@pytest.fixture
def tab(browser: Any, service: Service, request: pytest.FixtureRequest) -> Iterator[Tab]:
    t = Tab(browser, service, request.node.name.removeprefix("test_")[:40])
    try:
        yield t
    finally:
        t.close()


def event_ids(tab: Tab) -> list[str]:
    return tab.page.eval_on_selector_all("#timeline li[data-event]", "els => els.map(e => e.dataset.event)")


def test_approve_in_the_browser_and_see_the_answer(service: Service, tab: Tab) -> None:
    key = api_key(service, "alice")
    tab.login(key)
    run_id = tab.start("invoice", "Pay my invoice")
    page = tab.page
    page.wait_for_selector("#approve", timeout=HANG_MS)  # the pending approval arrived over the stream
    page.wait_for_selector("#timeline li.confirm")
    amount = page.locator("#pending-arguments tr", has_text="amount")
    assert "untrusted content" in amount.inner_text()  # 4200 came from the invoice page
    result = page.locator("#timeline pre.result").first.inner_text()
    assert "<script>window.__pwned = 1; alert('pwned')</script>" in result  # shown as text
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#timeline a", has_text="the whole result").count() == 1
    tab.shot("awaiting")
    page.click("#approve")
    page.wait_for_selector("#answer", timeout=HANG_MS)
    page.wait_for_selector("#timeline li.stop", timeout=HANG_MS)
    assert page.inner_text("#answer") == "<b>Charged</b>: charged 4200"
    assert page.inner_text("#run-status") == "completed"
    ids = event_ids(tab)
    assert len(ids) == len(set(ids))
    assert service.ledger() == ["charge 4200"]
    wait_status(service, {"Authorization": f"Bearer {key}"}, run_id, "completed")
    tab.shot("approved")
    assert tab.aborted == []  # the page asked nothing of the internet


def test_deny_and_cancel(service: Service, tab: Tab) -> None:
    tab.login(api_key(service, "alice"))
    tab.start("billing", "charge 99")
    page = tab.page
    page.wait_for_selector("#deny", timeout=HANG_MS)
    page.fill("input[name=reason]", "not today")
    page.click("#deny")
    page.wait_for_selector("#timeline li.stop", timeout=HANG_MS)
    assert "denied" in page.inner_text("#timeline")
    assert service.ledger() == []
    tab.shot("denied")
    tab.start("slow", "wait a lot")
    page.wait_for_selector("#timeline li.tool-call", timeout=HANG_MS)  # running: a tool call came back
    page.click("#cancel")
    page.wait_for_selector("#run-status.s-cancelled", timeout=HANG_MS)
    page.wait_for_selector("#timeline li.stop", timeout=HANG_MS)
    assert page.locator("#cancel").count() == 0
    tab.shot("cancelled")


def test_the_timeline_catches_up_after_the_connection_drops(service: Service, tab: Tab) -> None:
    """The server is stopped mid-run and started again: the page's stream reconnects with the id of
    the last piece it showed and the timeline goes on with no gap and no duplicate."""
    key = api_key(service, "alice")
    tab.login(key)
    run_id = tab.start("slow", "wait a lot")
    page = tab.page
    page.locator("#timeline li.tool-call").nth(2).wait_for(timeout=HANG_MS)
    service.stop()
    time.sleep(1.0)
    before = event_ids(tab)
    service.start()
    page.locator("#timeline li.tool-call").nth(11).wait_for(timeout=HANG_MS)
    ids = event_ids(tab)
    assert ids[:len(before)] == before and len(ids) > len(before)
    assert len(ids) == len(set(ids)), "a piece was shown twice"
    seqs = sorted({int(i.split(".")[0]) for i in ids})
    assert seqs == list(range(seqs[0], seqs[-1] + 1)), f"a gap in the timeline: {seqs}"
    tab.shot("reconnected")
    # what the drop itself logs: the cut stream, the extension's note of it, the refused reconnects,
    # the duration's reloads that found no server
    expected = ("ERR_INCOMPLETE_CHUNKED_ENCODING", "htmx:sse:error", "ERR_CONNECTION_REFUSED",
                "htmx:error: Failed to fetch")
    tab.errors = [e for e in tab.errors if not any(x in e for x in expected)]
    httpx = pytest.importorskip("httpx")
    httpx.post(f"{service.url}/v1/tasks/{run_id}/cancel", headers={"Authorization": f"Bearer {key}"}, timeout=HANG)


def test_another_users_run_is_not_reachable(browser: Any, service: Service, tab: Tab) -> None:
    tab.login(api_key(service, "alice"))
    run_id = tab.start("calc", "add 2 and 3")
    tab.page.wait_for_selector("#answer", timeout=HANG_MS)
    bob = Tab(browser, service, "bob")
    try:
        bob.login(api_key(service, "bob"))
        response = bob.page.goto(f"{service.url}/runs/{run_id}")
        assert response is not None and response.status == 404
        assert "no task" in bob.page.inner_text("main")
        bob.errors = [e for e in bob.errors if "404" not in e]  # the browser logs the 404 itself
        assert run_id not in bob.page.goto(f"{service.url}/runs").text()  # type: ignore[union-attr]
        bob.shot("not-found")
    finally:
        bob.close()


def test_usage_page_draws_its_chart(service: Service, tab: Tab) -> None:
    tab.login(api_key(service, "alice"))
    tab.start("calc", "add 2 and 3")
    tab.page.wait_for_selector("#answer", timeout=HANG_MS)
    tab.page.goto(service.url + "/usage?by=tool")
    assert tab.page.locator("#chart rect").count() == 1
    assert "add" in tab.page.inner_text("#usage")
    tab.shot("usage")


def test_the_runs_list_follows_a_run_to_its_end_without_a_reload(service: Service, tab: Tab) -> None:
    """The runs page, left open, gets its rows over SSE when they change: the run's status turns from
    awaiting_approval to cancelled there, with no reload of the page."""
    httpx = pytest.importorskip("httpx")
    key = api_key(service, "alice")
    tab.login(key)
    run_id = tab.start("billing", "charge 99")
    page = tab.page
    page.wait_for_selector("#deny", timeout=HANG_MS)
    page.goto(service.url + "/runs")
    page.evaluate("window.__same_page = 1")
    status = page.locator(f'tr[data-run="{run_id}"] .status')
    assert status.inner_text() == "awaiting_approval"
    httpx.post(f"{service.url}/v1/tasks/{run_id}/cancel", headers={"Authorization": f"Bearer {key}"}, timeout=HANG)
    sync_api.expect(status).to_have_text("cancelled", timeout=HANG_MS)
    assert page.evaluate("window.__same_page") == 1  # the rows changed in place
    assert page.request.get(service.url + "/favicon.ico").status == 200
    tab.shot("runs-live")


def test_a_waiting_runs_duration_goes_on_between_events(service: Service, tab: Tab) -> None:
    """A run parked for a person sends no events; its page's duration still counts up."""
    tab.login(api_key(service, "alice"))
    tab.start("billing", "charge 99")
    page = tab.page
    page.wait_for_selector("#deny", timeout=HANG_MS)
    before = page.inner_text("#duration")
    sync_api.expect(page.locator("#duration")).not_to_have_text(before, timeout=HANG_MS)
    page.click("#deny")
    page.wait_for_selector("#timeline li.stop", timeout=HANG_MS)
    sync_api.expect(page.locator("#duration[hx-trigger]")).to_have_count(0, timeout=HANG_MS)  # ended: it stops


if os.environ.get("TETHER_CONSOLE_SLOWMO"):  # for watching by hand: TETHER_CONSOLE_SLOWMO=1 pytest ... -s
    FLAGS.remove("--headless")


SHOTS = Path(os.environ.get("TETHER_SHOTS", str(ARTIFACTS)))  # where the transcript/waterfall/fork shots go


def finished_page(tab: Tab, service: Service, key: str, run_id: str) -> None:
    """The run's page once the run is done (its transcript is stored when it stops)."""
    wait_status(service, {"Authorization": f"Bearer {key}"}, run_id, "completed")
    tab.page.goto(f"{tab.base}/runs/{run_id}")


def test_a_transcript_is_readable_and_a_long_message_shows_in_whole_on_demand(service: Service, tab: Tab) -> None:
    key = api_key(service, "alice")
    tab.login(key)
    run_id = tab.start("writer", "Write <img src=x onerror=\"window.__pwned=1\"> three notes")
    finished_page(tab, service, key, run_id)
    page = tab.page
    assert page.locator("#transcript .call").count() == 5  # the task and four model calls
    call2 = page.locator("#call-2")
    assert "Step 2: noting." in call2.inner_text() and "noted step 1" in call2.inner_text()
    assert "calls note" in call2.inner_text()
    assert "<img src=x" in page.locator("#call-1 .sent").inner_text()  # the task, shown as text
    long = page.locator("#call-3 .reply pre.msg-text")
    before = len(long.inner_text())
    assert 4_000 <= before < 4_100
    page.locator("#call-3 .show-all").click()
    # the page's CSP forbids eval, which wait_for_function's string needs: Playwright's own matcher waits instead
    sync_api.expect(long).to_have_text(re.compile(r"^.{7000,}", re.S), timeout=HANG_MS)
    assert page.evaluate("window.__pwned") is None
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#call-2").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "transcript.png"), full_page=True)


def test_the_waterfall_nests_a_sub_agents_run_under_its_tool_call(service: Service, tab: Tab) -> None:
    key = api_key(service, "alice")
    tab.login(key)
    run_id = tab.start("crew", "add for me")
    finished_page(tab, service, key, run_id)
    page = tab.page
    kinds = page.eval_on_selector_all("#waterfall g.span", "els => els.map(e => e.dataset.kind + e.dataset.depth)")
    assert kinds == ["model0", "tool0", "subagent1", "model2", "tool2", "model2", "model0"], kinds
    box = {k: page.locator(f"#waterfall g.span >> nth={i} >> rect").bounding_box() for i, k in
           ((1, "tool"), (2, "sub"), (3, "child_model"), (6, "last"))}
    assert box["sub"] and box["tool"] and box["child_model"] and box["last"]
    assert box["tool"]["x"] <= box["child_model"]["x"] < box["last"]["x"]  # the child ran inside its tool call
    label = page.locator("#waterfall g.span >> nth=3 >> text.label").bounding_box()
    top = page.locator("#waterfall g.span >> nth=0 >> text.label").bounding_box()
    assert label and top and label["x"] > top["x"]  # indented under the tool call
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#waterfall").screenshot(path=str(SHOTS / "waterfall.png"))


def test_a_fork_from_step_3_continues_with_the_edited_message(service: Service, tab: Tab) -> None:
    key = api_key(service, "alice")
    tab.login(key)
    run_id = tab.start("writer", "Write three notes")
    finished_page(tab, service, key, run_id)
    page = tab.page
    page.locator("#call-3 details.fork summary").click()
    box = page.locator("#call-3 textarea[name=message]")
    assert box.input_value() == "Write three notes"
    box.fill("Write about <b>cats</b>")
    page.locator("#call-3 .fork-button").click()
    page.wait_for_url(re.compile(r".*/runs/t_[^/]+$"))
    fork_id = page.url.rsplit("/", 1)[1]
    assert fork_id != run_id
    page.wait_for_selector("#answer", timeout=HANG_MS)  # over the live stream
    assert page.locator("#answer").inner_text() == "Done with: Write about <b>cats</b>"
    assert page.locator("#forked-from").inner_text() == f"forked from {run_id} at step 3"
    page.goto(f"{tab.base}/runs/{fork_id}")
    assert page.locator("#transcript .call").count() == 5  # the task, three kept calls, one new
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "fork.png"), full_page=True)
    page.goto(f"{tab.base}/runs")
    row = page.locator(f"tr[data-run='{fork_id}'] .forked-from")
    assert row.inner_text() == f"forked from {run_id} at step 3"
    page.screenshot(path=str(SHOTS / "fork-in-runs-list.png"), full_page=True)
    page.goto(f"{tab.base}/runs/{run_id}")
    assert fork_id in page.locator("#forks").inner_text()
