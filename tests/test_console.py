"""The web console over real HTTP (`tether serve`, SQLite), driven by httpx as a browser would: the login
form and its session, CSRF on every form, users kept apart, the live timeline's HTML pieces (escaped,
resumable), approvals with where each argument came from, and the usage page. The browser tests
(tests/test_console_browser.py) drive the same pages in Chromium."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hang import HANG

httpx = pytest.importorskip("httpx")
pytest.importorskip("dbos")
pytest.importorskip("fastapi")
pytest.importorskip("jinja2")

from test_service import ROOT, Service, wait_status  # noqa: E402

CONSOLE_AGENTS = f"{ROOT / 'tests' / 'console_agents.py'}:AGENTS"  # the service tests' agents and two more


def running(home: Path) -> Iterator[Service]:
    """A server of its own (the tests count a user's runs), stopped after."""
    svc = Service(home)
    svc.start(CONSOLE_AGENTS)
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(tmp_path)


def api_key(service: Service, user: str) -> str:
    return service.key(user)["Authorization"].removeprefix("Bearer ")


def login(service: Service, key: str) -> httpx.Client:
    """A client holding a console session, logged in through the form as a browser does."""
    client = httpx.Client(base_url=service.url, timeout=HANG)
    form = client.get("/login")
    token = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert form.status_code == 200 and token
    done = client.post("/login", data={"csrf": token.group(1), "key": key})
    assert done.status_code == 303 and done.headers["location"] == "/runs", done.text
    return client


def csrf_of(client: httpx.Client, path: str = "/runs") -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', client.get(path).text)
    assert found
    return found.group(1)


def start(client: httpx.Client, agent: str, prompt: str) -> str:
    done = client.post("/runs", data={"csrf": csrf_of(client), "agent": agent, "prompt": prompt})
    assert done.status_code == 303, done.text
    return done.headers["location"].rsplit("/", 1)[1]


def pieces(client: httpx.Client, run_id: str, last_id: str | None = None, until: str | None = None,
           timeout: float = HANG) -> list[tuple[str, str, str]]:
    """(id, event name, data) of the live stream's events, up to the one whose data holds `until`
    (to the `end` event without)."""
    out: list[tuple[str, str, str]] = []
    headers = {"Last-Event-ID": last_id} if last_id else {}
    with client.stream("GET", f"/runs/{run_id}/live", headers=headers, timeout=timeout) as response:
        assert response.status_code == 200
        event: dict[str, str] = {}
        for line in response.iter_lines():
            if line == "":
                if event:
                    out.append((event.get("id", ""), event.get("event", ""), event.get("data", "")))
                    if event.get("event") == "end" or (until is not None and until in event.get("data", "")):
                        return out
                event = {}
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            event[field] = event[field] + "\n" + value if field == "data" and field in event else value
    return out


def sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The data of each event of an SSE stream (data lines joined), pings left out."""
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield "\n".join(data)
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


def test_login_needs_a_valid_key_and_the_forms_token(service: Service) -> None:
    key = api_key(service, "alice")
    anonymous = httpx.Client(base_url=service.url, timeout=HANG)
    assert anonymous.get("/runs").headers["location"] == "/login"  # no session: to the login form
    assert anonymous.get("/").headers["location"] == "/login"
    form = anonymous.get("/login")
    assert "HttpOnly" in form.headers["set-cookie"] and "SameSite=strict" in form.headers["set-cookie"]
    assert "script-src 'self'" in form.headers["content-security-policy"]
    token = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)  # type: ignore[union-attr]
    wrong = anonymous.post("/login", data={"csrf": token, "key": "tk_wrong"})
    assert wrong.status_code == 401 and "not a valid API key" in wrong.text
    token = re.search(r'name="csrf" value="([^"]+)"', wrong.text).group(1)  # type: ignore[union-attr]
    forged = anonymous.post("/login", data={"csrf": "not-the-token", "key": key})
    assert forged.status_code == 403 and "tether_session" not in forged.headers.get("set-cookie", "")
    token = re.search(r'name="csrf" value="([^"]+)"', forged.text).group(1)  # type: ignore[union-attr]
    other_site = anonymous.post("/login", data={"csrf": token, "key": key}, headers={"Origin": "https://evil.example"})
    assert other_site.status_code == 403
    client = login(service, key)
    cookie = client.cookies.get("tether_session")
    assert cookie and len(cookie) > 30
    page = client.get("/runs")
    assert page.status_code == 200 and "alice" in page.text


def test_every_form_needs_the_sessions_token_and_this_sites_origin(service: Service) -> None:
    client = login(service, api_key(service, "alice"))
    no_token = client.post("/runs", data={"agent": "calc", "prompt": "add"})
    assert no_token.status_code == 403 and "out of date" in no_token.text
    other_site = client.post("/runs", data={"csrf": csrf_of(client), "agent": "calc", "prompt": "add"},
                             headers={"Origin": "https://evil.example"})
    assert other_site.status_code == 403
    assert "No runs." in client.get("/runs").text  # nothing was started
    run_id = start(client, "calc", "add 2 and 3")
    assert client.post(f"/runs/{run_id}/cancel", data={"csrf": "x"}).status_code == 403
    assert client.post(f"/runs/{run_id}/decide", data={"csrf": "x", "call_id": "c1", "approved": "yes"}).status_code == 403
    bad = client.post("/runs", data={"csrf": csrf_of(client), "agent": "no-such-agent", "prompt": "x"})
    assert bad.status_code == 422 and "choose one of the agents" in bad.text


def test_a_session_ends_at_logout_and_when_its_key_is_revoked(service: Service) -> None:
    key = api_key(service, "alice")
    client = login(service, key)
    cookie = client.cookies.get("tether_session")
    out = client.post("/logout", data={"csrf": csrf_of(client)})
    assert out.status_code == 303 and out.headers["location"] == "/login"
    replay = httpx.Client(base_url=service.url, cookies={"tether_session": cookie}, timeout=HANG)
    assert replay.get("/runs").headers["location"] == "/login"  # the old cookie opens nothing
    client = login(service, key)
    assert client.get("/runs").status_code == 200
    revoked = service.cli("keys", "revoke", key)
    assert revoked.returncode == 0, revoked.stderr
    assert client.get("/runs").headers["location"] == "/login"
    assert client.get("/usage").headers["location"] == "/login"


def test_another_users_run_is_not_reachable(service: Service) -> None:
    alice = login(service, api_key(service, "alice"))
    bob = login(service, api_key(service, "bob"))
    run_id = start(alice, "calc", "add 2 and 3")
    assert bob.get(f"/runs/{run_id}").status_code == 404
    assert bob.get(f"/runs/{run_id}/live").status_code == 404
    assert bob.post(f"/runs/{run_id}/cancel", data={"csrf": csrf_of(bob)}).status_code == 404
    assert run_id not in bob.get("/runs").text
    assert run_id in alice.get("/runs").text


def test_the_timeline_escapes_tool_output_and_the_approval_shows_where_arguments_came_from(service: Service) -> None:
    key = api_key(service, "alice")
    client = login(service, key)
    run_id = start(client, "invoice", "Pay my invoice")
    wait_status(service, {"Authorization": f"Bearer {key}"}, run_id, "awaiting_approval")
    got = pieces(client, run_id, until='class="confirm"')
    html = "".join(data for _, _, data in got)
    assert re.search(r"<(script|img)\b", html, re.I) is None, re.search(r".{80}<(script|img)\b.{80}", html, re.I | re.S)
    assert "&lt;script&gt;window.__pwned" in html  # the page's markup, as text
    assert re.search(r'<img src=x', html) is None
    ids = [i for i, _, _ in got if i]
    assert len(ids) == len(set(ids))
    page = client.get(f"/runs/{run_id}")
    assert 'id="approve"' in page.text and "<b>Charged</b>" not in page.text
    row = re.search(r"<code>amount</code>.*?</tr>", page.text, re.S)
    assert row and "untrusted content" in row.group(0)  # 4200 was read from the invoice page
    whole = re.search(r'href="(/runs/[^"]+/results/[^"]+)"', html)
    assert whole, "a capped result links to the whole"
    full = client.get(whole.group(1))
    assert full.headers["content-type"].startswith("text/plain") and len(full.text) > 10_000
    bob = login(service, api_key(service, "bob"))
    assert bob.get(whole.group(1)).status_code == 404
    call_id = re.search(r'name="call_id" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    done = client.post(f"/runs/{run_id}/decide", data={"csrf": csrf_of(client), "call_id": call_id, "approved": "yes"})
    assert done.status_code == 303
    wait_status(service, {"Authorization": f"Bearer {key}"}, run_id, "completed")
    again = client.post(f"/runs/{run_id}/decide", data={"csrf": csrf_of(client), "call_id": call_id, "approved": "yes"})
    assert again.status_code == 409 and "not waiting" in again.text
    rest = pieces(client, run_id, last_id=ids[-1])
    assert {i for i, _, _ in rest if i}.isdisjoint(ids)  # resumed after the last piece seen: no duplicate
    tail = "".join(data for _, _, data in rest)
    assert "&lt;b&gt;Charged&lt;/b&gt;" in tail and rest[-1][1] == "end"
    assert service.ledger() == ["charge 4200"]


def test_runs_list_filters_and_pages_and_usage_adds_up(service: Service) -> None:
    key = api_key(service, "alice")
    client = login(service, key)
    ids = []
    for i in range(27):  # one at a time: the service admits 20 tasks in progress per user
        ids.append(start(client, "calc", f"add {i}"))
        wait_status(service, {"Authorization": f"Bearer {key}"}, ids[-1], "completed")
    first = client.get("/runs")
    shown = re.findall(r'<a href="/runs/(t_[^"/]+)">', first.text)
    assert len(shown) == 25 and shown[0] == ids[-1]
    older = re.search(r'id="older" href="([^"]+)"', first.text)
    assert older
    second = client.get(older.group(1).replace("&amp;", "&"))
    assert re.findall(r'<a href="/runs/(t_[^"/]+)">', second.text) == [ids[1], ids[0]]
    assert len(re.findall(r'<a href="/runs/(t_[^"/]+)">', client.get("/runs?agent=billing").text)) == 0
    assert len(re.findall(r'<a href="/runs/(t_[^"/]+)">', client.get("/runs?status=completed&agent=calc").text)) == 25
    usage = client.get("/usage?by=tool")
    assert usage.status_code == 200 and "<svg" in usage.text
    row = re.search(r"<tr><td>add</td><td class=\"num\">(\d+)</td>", usage.text)
    assert row and int(row.group(1)) == 27
    api = httpx.get(f"{service.url}/v1/tasks/{ids[0]}", headers={"Authorization": f"Bearer {key}"}, timeout=HANG).json()
    assert api["usage"]["model_calls"] == 2 and api["usage"]["tool_calls"] == 1  # one add, then the answer


def test_a_sub_agents_approval_is_asked_and_given_on_the_parents_page(service: Service) -> None:
    """Issue 28: the child's exact call surfaces in the parent's pending list, with where its
    values came from; approving it on the parent's page runs the child's call once."""
    key = api_key(service, "alice")
    client = login(service, key)
    run_id = start(client, "team", "Bill the customer")
    body = wait_status(service, {"Authorization": f"Bearer {key}"}, run_id, "awaiting_approval")
    assert [(p["call_id"], p["tool"], p["provenance"]) for p in body["pending_approvals"]] == [
        ("c1/c1", "charge", {"amount": "user"})]  # 99 is in the brief the (untainted) parent wrote
    page = client.get(f"/runs/{run_id}")
    assert "asked by the sub-agent &#39;biller&#39;" in page.text and 'value="c1/c1"' in page.text
    assert service.ledger() == []
    done = client.post(f"/runs/{run_id}/decide", data={"csrf": csrf_of(client), "call_id": "c1/c1", "approved": "yes"})
    assert done.status_code == 303
    body = wait_status(service, {"Authorization": f"Bearer {key}"}, run_id, "completed")
    assert body["answer"] == "The biller says: Done: charged 99" and service.ledger() == ["charge 99"]


# -- what a page shows, rendered as the server renders it (no server needed) ---------------------


def _render(macro: str, *args: object) -> str:
    from tether.server._console import _environment

    return str(getattr(_environment().get_template("fragments.html").make_module({}), macro)(*args))


def _row(status: str, *, error: str | None = None, created: float = 0.0, updated: float = 0.0,
         usage: dict | None = None) -> object:
    from tether.store._sql import RunRow

    return RunRow("t_1", "calc", "alice", status, "add", "cancelled" if status == "cancelled" else None, error, None,
                  usage or {}, 0, None, None, created, updated)


def test_a_notice_row_shows_what_the_notice_says() -> None:
    redacted = _render("event_row", "t_1", "notice", {"redacted": ["api_key: a secret"], "step": 1, "t": 0.5}, "3.0")
    assert "notice: redacted: api_key: a secret" in redacted and "null" not in redacted
    cancelled = _render("event_row", "t_1", "notice", {"cancelled": "cancelled by alice"}, "4.0")
    assert "notice: cancelled: cancelled by alice" in cancelled


def test_tool_arguments_are_shown_as_written_not_json_escaped() -> None:
    row = _render("event_row", "t_1", "tool_call", {"name": "Bash", "decision": "awaiting_approval", "is_error": True,
                                                    "arguments": {"command": "echo a > f && cat f", "timeout": 5}},
                  "2.0")
    assert "\\u003e" not in row and "\\u0026" not in row
    assert "command: echo a &gt; f &amp;&amp; cat f" in row and "timeout: 5" in row  # HTML-escaped, as text


def test_small_costs_keep_their_digits() -> None:
    from tether.server._console import _money

    assert [_money(v) for v in (0, 0.0000321, 0.00012, 1.5)] == ["$0.0000", "$0.000032", "$0.0001", "$1.5000"]


def test_the_day_chart_is_in_date_order_and_the_tool_chart_counts_calls() -> None:
    from tether.server._console import chart
    from tether.store._stats import UsageRow

    days = [UsageRow("2026-12-03", cost_usd=3.0), UsageRow("2026-12-01", cost_usd=2.0),
            UsageRow("2026-12-02", cost_usd=1.0)]  # as usage_stats gives them: the dearest first
    assert [b["label"] for b in chart(days, "day")["bars"]] == ["2026-12-01", "2026-12-02", "2026-12-03"]
    tools = [UsageRow("Bash", tool_calls=4, tool_errors=1), UsageRow("Read", tool_calls=2)]
    bars = chart(tools, "tool")["bars"]
    assert [b["value"] for b in bars] == ["4 calls, 1 failed", "2 calls"] and bars[0]["width"] > bars[1]["width"] > 0


def test_a_cancel_is_not_shown_as_an_error() -> None:
    from tether.store._stats import UsageRow

    cancelled = _render("summary", _row("cancelled", error="cancelled"), "csrf", True, UsageRow("t_1"))
    assert 'class="error"' not in cancelled and "Error:" not in cancelled and 'id="cancelled"' in cancelled
    failed = _render("summary", _row("error", error="run failed: boom"), "csrf", True, UsageRow("t_1"))
    assert '<p class="error">Error: run failed: boom</p>' in failed


def test_a_running_runs_duration_runs_to_now() -> None:
    import time

    from tether.store._stats import UsageRow

    started = time.time() - 600  # its row last changed a second after it started
    page = _render("summary", _row("running", created=started, updated=started + 1), "csrf", False, UsageRow("t_1"))
    shown = re.search(r'<span id="duration"([^>]*)>([\d.]+) min</span>', page)
    assert shown and float(shown.group(2)) >= 10.0, page
    assert 'hx-get="/runs/t_1/duration" hx-trigger="every 2s"' in shown.group(1)  # and it goes on between events
    done = _render("summary", _row("completed", created=started, updated=started + 1), "csrf", True, UsageRow("t_1"))
    assert '<span id="duration">1.0 s</span>' in done


# -- the same, through the server ----------------------------------------------------------------


def test_the_runs_list_shows_a_running_runs_spend_and_reloads_itself(service: Service) -> None:
    key = api_key(service, "alice")
    client = login(service, key)
    assert client.get("/favicon.ico").status_code == 200
    run_id = start(client, "slow", "wait a lot")
    pieces(client, run_id, until='class="model-call"')  # a model call is stored
    listing = client.get("/runs").text
    row = re.search(rf'<tr data-run="{run_id}">.*?</tr>', listing, re.S)
    assert row, listing
    cells = re.findall(r'<td class="num">([^<]*)</td>', row.group(0))
    assert cells[0] != "0", cells  # model calls so far, not the row's count, written when the run ends
    assert 'hx-sse:connect="/runs/rows/live"' in listing  # its rows come over SSE
    rows = client.get("/runs/rows")
    assert rows.status_code == 200 and rows.text.startswith('<tbody id="runs-rows"') and run_id in rows.text
    with client.stream("GET", "/runs/rows/live", timeout=HANG) as live:
        assert live.status_code == 200 and live.headers["content-type"].startswith("text/event-stream")
        events = sse_data(live.iter_lines())
        assert run_id in next(events)  # the table at once
        client.post(f"/runs/{run_id}/cancel", data={"csrf": csrf_of(client)})
        # then again when they change (and only then): the run's status turns cancelled
        assert any(f'data-run="{run_id}"' in rows and ">cancelled<" in rows for rows in events)
    wait_status(service, {"Authorization": f"Bearer {key}"}, run_id, "cancelled")
    page = client.get(f"/runs/{run_id}").text
    assert 'id="cancelled"' in page and "Error: cancelled" not in page


def test_a_run_page_shows_each_model_calls_messages_escaped_and_pages_a_long_one(service: Service) -> None:
    key = api_key(service, "alice")
    client = login(service, key)
    run_id = start(client, "writer", "Write <i>three</i> notes")
    wait_status(service, {"Authorization": f"Bearer {key}"}, run_id, "completed")
    html = client.get(f"/runs/{run_id}").text
    calls = re.findall(r'<div class="card call" data-step="(\d+)"', html)
    assert calls == ["0", "1", "2", "3", "4"]  # the task, then four model calls
    call2 = html.split('id="call-2"')[1].split('id="call-3"')[0]
    assert "Step 2: noting." in call2 and "noted step 1" in call2  # its reply, and the tool result new to it
    assert "&#34;n&#34;: 2" in call2 or "&quot;n&quot;: 2" in call2 or '"n": 2' not in call2  # arguments escaped
    assert "Write &lt;i&gt;three&lt;/i&gt; notes" in html and "<i>three</i>" not in html
    assert "&lt;b&gt;bold?&lt;/b&gt;" in html and "<b>bold?</b>" not in html
    long = re.search(r'hx-get="(/runs/[^"]+/messages/(\d+))"', html)
    assert long and re.search(r"show all 7,5\d\d characters", html)
    shown = re.search(rf'<pre class="msg-text" id="msg-{long.group(2)}">(.*?)</pre>', html, re.S)
    assert shown and len(shown.group(1)) < 4_200  # 4,000 characters, escaped
    whole = client.get(long.group(1), headers={"HX-Request": "true"})
    assert whole.status_code == 200 and whole.text.startswith(f'<pre class="msg-text" id="msg-{long.group(2)}">Step 3: noting. &lt;b&gt;')
    assert len(whole.text) > 7_500
    assert client.get(long.group(1)).headers["content-type"].startswith("text/plain")
    other = login(service, api_key(service, "bob"))
    assert other.get(long.group(1)).status_code == 404  # another user's message does not exist for them
    assert client.get(f"/runs/{run_id}/messages/999").status_code == 404


def test_the_waterfall_lays_out_calls_in_time_and_nests_a_sub_agent_under_its_tool_call(service: Service) -> None:
    key = api_key(service, "alice")
    client = login(service, key)
    run_id = start(client, "crew", "add for me")
    wait_status(service, {"Authorization": f"Bearer {key}"}, run_id, "completed")
    html = client.get(f"/runs/{run_id}").text
    bars = re.findall(r'<g class="span span-(\w+)" data-kind="\w+" data-depth="(\d)"', html)
    assert bars == [("model", "0"), ("tool", "0"), ("subagent", "1"), ("model", "2"), ("tool", "2"), ("model", "2"),
                    ("model", "0")], bars
    assert "sub-agent helper" in html and "tool helper" in html and "tool add" in html


def test_a_fork_from_a_step_runs_with_the_edited_message_and_is_linked_both_ways(service: Service) -> None:
    key = api_key(service, "alice")
    client = login(service, key)
    run_id = start(client, "writer", "Write three notes")
    wait_status(service, {"Authorization": f"Bearer {key}"}, run_id, "completed")
    token = csrf_of(client, f"/runs/{run_id}")
    forged = client.post(f"/runs/{run_id}/fork", data={"csrf": "x", "step": "3"})
    assert forged.status_code == 403
    bob = login(service, api_key(service, "bob"))
    assert bob.post(f"/runs/{run_id}/fork", data={"csrf": csrf_of(bob), "step": "3"}).status_code == 404
    too_far = client.post(f"/runs/{run_id}/fork", data={"csrf": token, "step": "9"})
    assert too_far.status_code == 422 and "fork at a step in 0..3" in too_far.text
    done = client.post(f"/runs/{run_id}/fork", data={"csrf": token, "step": "3", "message": "Write about <cats>"})
    assert done.status_code == 303, done.text
    fork_id = done.headers["location"].rsplit("/", 1)[1]
    body = wait_status(service, {"Authorization": f"Bearer {key}"}, fork_id, "completed")
    assert body["answer"] == "Done with: Write about <cats>"
    page = client.get(f"/runs/{fork_id}").text
    assert f'forked from <a href="/runs/{run_id}">{run_id}</a> at step 3' in page
    assert "Write about &lt;cats&gt;" in page
    assert len(re.findall(r'<div class="card call" data-step="[1-9]', page)) == 4  # three kept, one new
    assert page.count(f"kept from run {run_id} (not made again)") == 3  # their figures are the parent's
    assert "kept from run" not in page.split('id="call-4"')[1]
    assert re.search(rf'Forks of this run: <a href="/runs/{fork_id}">', client.get(f"/runs/{run_id}").text)
    listed = client.get("/runs").text
    row = re.search(rf'<tr data-run="{fork_id}">.*?</tr>', listed, re.S)
    assert row and f"forked from <a href=\"/runs/{run_id}\">{run_id}</a> at step 3" in row.group(0)
    unchanged = client.post(f"/runs/{run_id}/fork", data={"csrf": token, "step": "1", "message": "Write three notes"})
    second = unchanged.headers["location"].rsplit("/", 1)[1]
    assert wait_status(service, {"Authorization": f"Bearer {key}"}, second, "completed")["answer"] == \
        "Done with: Write three notes"
