"""The web console `tether serve` serves at `/`: the same users, tasks and event stream as the API, as
server-rendered pages (Jinja2, every value escaped) with htmx 4 and its SSE extension vendored.

    GET  /login, POST /login, POST /logout   an API key opens a session (cookie: HttpOnly, SameSite=Strict)
    GET  /runs                               the user's runs (?status=, ?agent=, ?before= for the next page)
    GET  /runs/new, POST /runs               start a run from a form
    GET  /runs/{id}                          a run: summary, pending approval, task state, transcript,
                                             waterfall, live timeline
    GET  /runs/{id}/messages/{index}         one transcript message in whole (the page shows 4,000 characters)
    POST /runs/{id}/fork                     a new run from step N of this one (optionally an edited message)
    GET  /runs/{id}/live                     the timeline as HTML pieces over SSE (Last-Event-ID resumes)
    GET  /runs/{id}/results/{handle}         a capped tool result in whole
    GET  /runs/rows, /runs/{id}/duration     pieces the pages reload while a run is unfinished
    POST /runs/{id}/decide, /runs/{id}/cancel
    GET  /usage                              tokens and cost per day, agent, model, tool or run, with a chart

Every POST carries the session's CSRF token (login: a token in a cookie of its own), and a POST whose
Origin header names another site is refused. Pages are sent with a Content-Security-Policy that allows
only the service's own scripts and styles, so markup that got past escaping still cannot run.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import math
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import escape
from sse_starlette.sse import EventSourceResponse

from tether._errors import InvalidInput, TetherError
from tether._types import to_jsonable
from tether.durable._fork import fork_state, said_by_user
from tether.policy._canonical import leaves
from tether.server._events import FINISHED, parse_last_id, stream
from tether.server._tasks import TaskError, Tasks
from tether.server._transcript import MAX_DEPTH, show_content, spans, transcript, waterfall
from tether.store._stats import GROUPS, UsageRow, run_totals, usage_stats

HERE = Path(__file__).parent / "console"
SESSION_COOKIE = "tether_session"
LOGIN_COOKIE = "tether_login_csrf"
SESSION_HOURS = 12
PAGE = 25
ROWS_EVERY = 1.0  # seconds between looks at an open runs page's rows (sent only when they change)
STATUSES = ("pending", "running", "awaiting_approval", "completed", "stopped", "error", "cancelled")
ORIGIN_WORDS = {"user": "the user's words", "trusted": "a trusted tool", "untrusted": "untrusted content",
                "model": "the model (no source found)", "neutral": "no information (empty, yes/no)"}
STATUS_KINDS = ("status", "confirm_request", "answer", "stop")  # SSE events after which the run's row changed
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class NotLoggedIn(TetherError):
    """A console request without a live session (a page redirects to the login form)."""


def _tokens(usage: dict[str, Any]) -> str:
    return f"{int(usage.get('input_tokens', 0)) + int(usage.get('output_tokens', 0)):,}"


def _money(value: Any) -> str:
    """Dollars to four places, or to two significant digits below $0.0001 (a small model's call)."""
    v = float(value or 0)
    if 0 < abs(v) < 0.0001:
        return f"${v:.{1 - math.floor(math.log10(abs(v)))}f}"
    return f"${v:.4f}"


def _plain(value: Any) -> str:
    """A value as a person reads it: text as it is (no JSON escapes), a list of texts one per line,
    anything else as JSON with its characters unescaped."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    return json.dumps(value, ensure_ascii=False, default=str)


def _notice(d: dict[str, Any]) -> str:
    """A notice event's own keys ({"redacted": [...]}, {"cancelled": why}, ...), without its timing."""
    return "; ".join(f"{k}: {_plain(v)}" for k, v in d.items() if k not in ("step", "t", "duration")) or "(empty)"


def _arguments(arguments: Any) -> str:
    """A tool call's arguments, one per line, each value as _plain shows it: the exact command."""
    if not isinstance(arguments, dict):
        return _plain(arguments)
    return "\n".join(f"{k}: {_plain(v)}" for k, v in arguments.items())


def _elapsed(row: Any) -> float:
    """How long a run has taken: to its last update once finished, to now while it is not."""
    return (row.updated_at if row.status in FINISHED else time.time()) - row.created_at


def _seconds(value: Any) -> str:
    v = float(value or 0)
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.1f} s" if v < 120 else f"{v / 60:.1f} min"


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def _at(d: dict[str, Any]) -> str:
    return f"step {d.get('step', 0)} · t+{float(d.get('t', 0.0)):.2f} s" if "t" in d else ""


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.globals.update(tokens=_tokens, money=_money, seconds=_seconds, when=_when, at=_at, origin_words=ORIGIN_WORDS,
                       leaves=leaves, notice=_notice, arguments=_arguments, elapsed=_elapsed, finished=FINISHED)
    return env


def chart(rows: list[UsageRow], by: str = "", width: int = 640) -> dict[str, Any]:
    """A horizontal bar chart of cost per group (tokens when nothing cost anything, tool calls when no
    tokens either: the tool groups), as SVG geometry; days in date order, other groups as given."""
    if any(r.cost_usd for r in rows):
        values = [(r.key, r.cost_usd, _money(r.cost_usd)) for r in rows]
    elif any(r.input_tokens + r.output_tokens for r in rows):
        values = [(r.key, r.input_tokens + r.output_tokens, f"{r.input_tokens + r.output_tokens:,} tokens")
                  for r in rows]
    else:
        values = [(r.key, r.tool_calls, f"{r.tool_calls:,} calls" + (f", {r.tool_errors:,} failed" if r.tool_errors
                                                                      else "")) for r in rows]
    values = sorted(values, key=lambda v: v[0])[-20:] if by == "day" else values[:20]  # the last 20 days
    left, top = 160, max((v for _, v, _ in values), default=0) or 1
    bars = [{"label": key[:24], "y": i * 22, "width": round((width - left - 90) * v / top, 1), "value": label}
            for i, (key, v, label) in enumerate(values)]
    return {"width": width, "height": max(22 * len(bars), 22), "left": left, "bars": bars}


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form body (the body size is capped by the app's BodyLimit)."""
    body = (await request.body()).decode("utf-8", "replace")
    return {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}


def _same_site(request: Request) -> bool:
    """A POST's Origin, when the browser sends one, names this service."""
    origin = request.headers.get("origin")
    return origin is None or origin == f"{request.url.scheme}://{request.url.netloc}"


def add_console(app: FastAPI, tasks: Tasks) -> None:
    """The console's routes and its static files on `app`."""
    env = _environment()
    app.mount("/console/static", StaticFiles(directory=HERE / "static"), name="console-static")

    def page(name: str, code: int = 200, /, **values: Any) -> HTMLResponse:
        values.setdefault("user", None)
        values.setdefault("error", None)
        return HTMLResponse(env.get_template(name).render(**values), status_code=code, headers=SECURITY_HEADERS)

    def fragments() -> Any:
        return env.get_template("fragments.html").make_module({})

    async def maybe_session(request: Request) -> tuple[str, str] | None:
        """(user, csrf) of the request's live session, if it has one."""
        token = request.cookies.get(SESSION_COOKIE)
        return await tasks.db(tasks.tables.session, token) if token and tasks.tables is not None else None

    async def session(request: Request) -> tuple[str, str]:
        """(user, csrf) of the request's session; NotLoggedIn (to the login form) without one."""
        found = await maybe_session(request)
        if found is None:
            raise NotLoggedIn()
        return found

    async def posted(request: Request) -> tuple[str, str, dict[str, str]]:
        """(user, csrf, form) of a POST from this session's own page; TaskError(403) otherwise."""
        user, csrf = await session(request)
        form = await _form(request)
        if not _same_site(request) or not hmac.compare_digest(form.get("csrf", "").encode(), csrf.encode()):
            raise TaskError(403, "this form is out of date or came from another site: reload the page and try again")
        return user, csrf, form

    def back(path: str) -> RedirectResponse:
        return RedirectResponse(path, status_code=303)

    @app.exception_handler(NotLoggedIn)
    async def not_logged_in(request: Request, _: NotLoggedIn) -> Response:
        if request.url.path.endswith("/live"):
            return PlainTextResponse("log in first", status_code=401)
        return back("/login")

    def guarded(handler: Any) -> Any:
        """Console errors as a page (the API's are JSON): the message, and a way back."""
        @functools.wraps(handler)
        async def run(request: Request, **kwargs: Any) -> Response:
            try:
                return await handler(request, **kwargs)
            except TaskError as exc:
                user, csrf = await maybe_session(request) or (None, "")
                return page("error.html", exc.status, user=user, csrf=csrf, error=str(exc))
        return run

    @app.get("/", include_in_schema=False)
    async def home(request: Request) -> Response:
        return back("/runs" if await maybe_session(request) else "/login")

    def login_page(request: Request, code: int = 200, error: str | None = None) -> Response:
        """The login form with a fresh token, also set as a cookie (double submit: a page on another
        site can neither read the cookie nor set the field to match it)."""
        token = secrets.token_urlsafe(24)
        response = page("login.html", code, login_csrf=token, hours=SESSION_HOURS, error=error)
        _cookie(response, request, LOGIN_COOKIE, token, 600)
        return response

    @app.get("/login", include_in_schema=False)
    async def login_form(request: Request) -> Response:
        return login_page(request)

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        form = await _form(request)
        expected = request.cookies.get(LOGIN_COOKIE, "")
        if not expected or not _same_site(request) or not hmac.compare_digest(form.get("csrf", "").encode(),
                                                                             expected.encode()):
            return login_page(request, 403, "the login form was out of date: try again")
        opened = (await tasks.db(tasks.tables.open_session, form.get("key", "").strip(), SESSION_HOURS * 3600)
                  if tasks.tables is not None and form.get("key", "").strip() else None)
        if opened is None:
            return login_page(request, 401, "that is not a valid API key (`tether keys add USER` makes one)")
        response = back("/runs")
        _cookie(response, request, SESSION_COOKIE, opened[0], SESSION_HOURS * 3600)
        response.delete_cookie(LOGIN_COOKIE, path="/")
        return response

    @app.post("/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        try:
            await posted(request)
        except TaskError:
            return back("/runs")
        await tasks.db(tasks.tables.close_session, request.cookies.get(SESSION_COOKIE, ""))  # type: ignore[union-attr]
        response = back("/login")
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    async def runs_listed(request: Request, user: str) -> dict[str, Any]:
        """The runs page's rows for its query, with what the unfinished ones have spent so far (their
        row's usage is written when they end) and the query that reloads the same rows."""
        q = request.query_params
        status = q.get("status") if q.get("status") in STATUSES else None
        agent = q.get("agent") if q.get("agent") in tasks.registry.names() else None
        try:
            before = float(q["before"]) if q.get("before") else None
        except ValueError:
            before = None
        rows = await tasks.list(user, status, PAGE, before, agent)
        live = {r.run_id: await tasks.db(run_totals, tasks.rt.store, r.run_id) for r in rows if r.status not in FINISHED}
        forked = await tasks.db(tasks.rt.store.forked_from, [r.run_id for r in rows])
        next_before = rows[-1].created_at if len(rows) == PAGE else None
        next_query = urlencode({k: v for k, v in (("status", status), ("agent", agent), ("before", next_before)) if v})
        this_query = urlencode({k: v for k, v in (("status", status), ("agent", agent), ("before", before)) if v})
        return {"runs": rows, "live": live, "forked": forked, "status": status, "agent": agent, "next_before": next_before,
                "next_query": next_query, "this_query": this_query}

    @app.get("/runs", include_in_schema=False)
    async def runs(request: Request) -> Response:
        user, csrf = await session(request)
        return page("runs.html", user=user, csrf=csrf, statuses=STATUSES, agents=tasks.registry.names(),
                    **await runs_listed(request, user))

    async def rows_html(request: Request, user: str, *, table: bool = False) -> str:
        listed = await runs_listed(request, user)
        macro = fragments().runs_table if table else fragments().runs_rows
        return str(macro(listed["runs"], listed["live"], listed["this_query"], bool(listed["status"] or listed["agent"]),
                         listed["forked"]))

    @app.get("/runs/rows", include_in_schema=False)
    async def runs_rows(request: Request) -> Response:
        """The runs table's body alone."""
        user, _ = await session(request)
        return HTMLResponse(await rows_html(request, user), headers=SECURITY_HEADERS)

    @app.get("/runs/rows/live", include_in_schema=False)
    async def runs_rows_live(request: Request) -> Response:
        """The runs table over SSE: sent again whenever it changes (a run's status or spend so far, a
        new run), looked at once a second while the page is open."""
        user, _ = await session(request)

        async def changes() -> AsyncIterator[dict[str, str]]:
            last = ""
            while not await request.is_disconnected():
                html = await rows_html(request, user, table=True)
                if html != last:
                    last = html
                    yield {"data": html}
                await asyncio.sleep(ROWS_EVERY)

        return EventSourceResponse(changes(), ping=15, headers={"Cache-Control": "no-store",
                                                                "X-Content-Type-Options": "nosniff"})

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return Response((HERE / "static" / "favicon.svg").read_bytes(), media_type="image/svg+xml",
                        headers={"Cache-Control": "public, max-age=86400"})

    @app.get("/runs/new", include_in_schema=False)
    async def new_run(request: Request) -> Response:
        user, csrf = await session(request)
        return page("new.html", user=user, csrf=csrf, agents=tasks.registry.names(),
                    agent=request.query_params.get("agent"), prompt="")

    @guarded
    async def start_run(request: Request) -> Response:
        user, csrf, form = await posted(request)
        agent, prompt = form.get("agent", ""), form.get("prompt", "").strip()
        if agent not in tasks.registry.names() or not prompt:
            return page("new.html", 422, user=user, csrf=csrf, agents=tasks.registry.names(), agent=agent,
                        prompt=prompt, error="choose one of the agents and write the task")
        task_id, _ = await tasks.submit(user, {"prompt": prompt, "agent": agent})
        return back(f"/runs/{quote(task_id, safe='')}")

    app.post("/runs", include_in_schema=False)(start_run)

    @guarded
    async def run_page(request: Request, run_id: str) -> Response:
        user, csrf = await session(request)
        row = await tasks.get(user, run_id)
        findings = await tasks.db(tasks.rt.store.findings, run_id)
        state = await tasks.db(tasks.rt.store.state, run_id)
        spent = await tasks.db(run_totals, tasks.rt.store, run_id)
        store = tasks.rt.store
        events = await tasks.db(store.events, run_id)
        children = await tasks.db(_children, store, run_id, 1)
        forked = (await tasks.db(store.forked_from, [run_id])).get(run_id)
        forks = await tasks.db(store.forks, run_id, user)
        content = show_content()
        return page("run.html", user=user, csrf=csrf, row=row, finished=row.status in FINISHED, findings=findings,
                    task_state=_task_state(state), spent=spent, content=content,
                    transcript=transcript(state.messages, events) if state is not None and content else None,
                    waterfall=waterfall(spans(events, children)), forked=forked, forks=forks)

    app.get("/runs/{run_id}", include_in_schema=False)(run_page)

    @app.get("/runs/{run_id}/live", include_in_schema=False)
    async def live(request: Request, run_id: str) -> Response:
        user, csrf = await session(request)
        try:
            await tasks.get(user, run_id)
        except TaskError as exc:
            return PlainTextResponse(str(exc), status_code=exc.status)
        return EventSourceResponse(_pieces(tasks, fragments(), user, csrf, run_id,
                                           request.headers.get("last-event-id")), ping=15, headers={
            "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})

    @guarded
    async def duration(request: Request, run_id: str) -> Response:
        """The run's duration alone, which its page reloads while the run is unfinished."""
        user, _ = await session(request)
        row = await tasks.get(user, run_id)
        return HTMLResponse(str(fragments().duration(row)), headers=SECURITY_HEADERS)

    app.get("/runs/{run_id}/duration", include_in_schema=False)(duration)

    @guarded
    async def whole_result(request: Request, run_id: str, handle: str) -> Response:
        user, _ = await session(request)
        await tasks.get(user, run_id)
        text = await tasks.db(tasks.rt.store.get, handle, user)
        if text is None:
            raise TaskError(404, f"no result {handle} of yours")
        return PlainTextResponse(text, headers={**SECURITY_HEADERS, "Content-Type": "text/plain; charset=utf-8"})

    app.get("/runs/{run_id}/results/{handle}", include_in_schema=False)(whole_result)

    @guarded
    async def whole_message(request: Request, run_id: str, index: int) -> Response:
        """One message of the run's transcript in whole: a piece of HTML for the page's "show all"
        (an htmx request), the plain text otherwise."""
        user, _ = await session(request)
        await tasks.get(user, run_id)
        state = await tasks.db(tasks.rt.store.state, run_id)
        if not show_content() or state is None or not 0 <= index < len(state.messages):
            raise TaskError(404, f"no message {index} in the stored transcript of run {run_id}")
        text = state.messages[index].content or ""
        if request.headers.get("hx-request"):
            return HTMLResponse(f'<pre class="msg-text" id="msg-{index}">{escape(text)}</pre>', headers=SECURITY_HEADERS)
        return PlainTextResponse(text, headers={**SECURITY_HEADERS, "Content-Type": "text/plain; charset=utf-8"})

    app.get("/runs/{run_id}/messages/{index}", include_in_schema=False)(whole_message)

    @guarded
    async def fork(request: Request, run_id: str) -> Response:
        """A new run of the same agent from step N of this one (the owner's own runs only)."""
        user, _, form = await posted(request)
        row = await tasks.get(user, run_id)
        new_id = await _fork(tasks, user, row, form)
        return back(f"/runs/{quote(new_id, safe='')}")

    app.post("/runs/{run_id}/fork", include_in_schema=False)(fork)

    @guarded
    async def decide(request: Request, run_id: str) -> Response:
        user, _, form = await posted(request)
        approved = form.get("approved") == "yes"
        await tasks.confirm(user, run_id, form.get("call_id", ""), approved, form.get("reason", "")[:2000],
                            batch=form.get("batch") == "yes")
        return back(f"/runs/{quote(run_id, safe='')}")

    app.post("/runs/{run_id}/decide", include_in_schema=False)(decide)

    @guarded
    async def cancel(request: Request, run_id: str) -> Response:
        user, _, _ = await posted(request)
        await tasks.cancel(user, run_id)
        return back(f"/runs/{quote(run_id, safe='')}")

    app.post("/runs/{run_id}/cancel", include_in_schema=False)(cancel)

    @app.get("/usage", include_in_schema=False)
    async def usage(request: Request) -> Response:
        user, csrf = await session(request)
        by = request.query_params.get("by", "day")
        by = by if by in GROUPS else "day"
        try:
            days = float(request.query_params.get("days") or 0) or None
        except ValueError:
            days = None
        since = time.time() - days * 86_400 if days else None
        rows = await tasks.db(usage_stats, tasks.rt.store, by, since=since, user=user)
        if by == "day":  # in date order, as the chart
            rows.sort(key=lambda r: r.key)
        return page("usage.html", user=user, csrf=csrf, rows=rows, by=by, days=days, groups=GROUPS,
                    chart=chart(rows, by))


async def _pieces(tasks: Tasks, parts: Any, user: str, csrf: str, run_id: str,
                  last_event_id: str | None) -> AsyncIterator[dict[str, Any]]:
    """The run's SSE events as HTML: each a timeline row (appended) and, where the run's status may have
    changed, its summary and pending approval re-rendered from the stored row (swapped in by id). Ids
    are the API stream's, so a reconnect with Last-Event-ID continues after the last piece shown.
    Ends with a named `end` event, which closes the browser's stream."""
    live_text = False
    row: Any = None
    # what the run spent up to the piece the browser last showed, then each model call as it streams
    seen = parse_last_id(last_event_id)[0]
    spent = await tasks.db(run_totals, tasks.rt.store, run_id, seen) if seen >= 0 else UsageRow(run_id)
    async for item in stream(tasks.rt.store, tasks.feed, run_id, last_event_id, timing=True):
        kind, data = item["event"], json.loads(item["data"])
        if kind == "model_call" and parse_last_id(item["id"])[0] > seen:  # at `seen`: counted above already
            spent.add_call(data)
        html: list[str] = []
        if kind == "text_delta":
            swap = "innerHTML" if data.get("restart") or not live_text else "beforeend"
            html.append(f'<pre id="live-text" class="meta" hx-swap-oob="{swap}">'
                        f'{escape(str(data.get("text", "")))}</pre>')
            live_text = True
        else:
            html.append(str(parts.event_row(run_id, kind, data, item["id"])))
            if kind in ("model_call", "answer") and live_text:
                html.append('<pre id="live-text" class="meta" hx-swap-oob="true"></pre>')
                live_text = False
        if kind in STATUS_KINDS or row is None:  # the run's row changes only with these: read it then
            row = await tasks.get(user, run_id)
        if kind in STATUS_KINDS or kind == "model_call":  # status, or what the run has spent
            html.append(str(parts.summary(row, csrf, row.status in FINISHED, spent, oob=True)))
            html.append(str(parts.pending_panel(row, csrf, oob=True)))
        if kind == "stop":  # the run's findings and task state as it left them
            findings = await tasks.db(tasks.rt.store.findings, run_id)
            state = await tasks.db(tasks.rt.store.state, run_id)
            html.append(str(parts.task_panel(findings, _task_state(state), oob=True)))
        yield {"id": item["id"], "data": "".join(html)}
    yield {"event": "end", "data": ""}


def _children(store: Any, run_id: str, depth: int) -> list[tuple[Any, list[Any], list[Any]]]:
    """The run's sub-agent runs in the order they started: (row, events, their own sub-agent runs)."""
    if depth > MAX_DEPTH:
        return []
    rows = sorted(store.runs(parent=run_id, limit=200), key=lambda r: r.created_at)
    return [(r, store.events(r.run_id), _children(store, r.run_id, depth + 1)) for r in rows]


async def _fork(tasks: Tasks, user: str, row: Any, form: dict[str, str]) -> str:
    """Start the fork `form` asks for (step, optional edited last user message) as a task of its own,
    queued like any other; its config names the run and step it came from."""
    from dbos import SetWorkflowID

    from tether.durable._runtime import run_workflow

    assert tasks.rt is not None
    store = tasks.rt.store
    if row.agent not in tasks.registry.names():
        raise TaskError(422, f"the agent {row.agent!r} of run {row.run_id} is not served here, so it cannot be forked "
                             "here (`tether runs fork` forks CLI runs)")
    state = await tasks.db(store.state, row.run_id)
    if state is None:
        raise TaskError(409, f"run {row.run_id} has no stored transcript yet: fork it once it has stopped or parked")
    try:
        step = int(form.get("step", ""))
    except ValueError:
        raise TaskError(422, "say which step to fork from (a whole number)") from None
    task_id = "t_" + uuid.uuid4().hex[:16]
    message = form.get("message", "").replace("\r\n", "\n")
    try:
        new = fork_state(state, step, run_id=task_id, message=None)
        users = [m for m in new.messages if said_by_user(m)]
        if message.strip() and (not users or message != users[-1].content):  # unchanged: no edit
            new = fork_state(state, step, run_id=task_id, message=message)
    except InvalidInput as exc:
        raise TaskError(422, str(exc)) from None
    parent = await tasks.db(store.config, row.run_id) or {}
    config: dict[str, Any] = {"user": user, "limits": parent.get("limits"), "metadata": parent.get("metadata") or {},
                              "forked_from": {"run": row.run_id, "step": step}}
    if row.agent in tasks.registry.staged:
        config["task_id"] = task_id
    prompt = next((m.content for m in reversed(new.messages) if said_by_user(m)), row.prompt)
    await tasks.db(tasks._admit, user, task_id, {"agent": row.agent, "prompt": prompt}, config)
    try:
        with SetWorkflowID(task_id):
            await tasks.queue.enqueue_async(run_workflow, {"agent": row.agent, "state": to_jsonable(new),
                                                           "started_at": time.time()})
    except Exception:
        await tasks.db(store.set_status, task_id, "error")
        raise
    return task_id


def _task_state(state: Any) -> str:
    return json.dumps(state.task_state, indent=1, default=str) if state is not None and state.task_state else ""


def _cookie(response: Response, request: Request, name: str, value: str, max_age: int) -> None:
    response.set_cookie(name, value, max_age=max_age, path="/", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")

