"""The task service's HTTP API (FastAPI): submit tasks, watch them live, confirm, cancel.

    POST /v1/tasks                 {prompt, agent, limits?, metadata?} -> {task_id}   (Idempotency-Key)
    GET  /v1/tasks                 the caller's tasks, newest first (?status=, ?limit=, ?before=)
    GET  /v1/tasks/{id}            status, usage, stop reason, answer, findings, pending approvals
    GET  /v1/tasks/{id}/events     server-sent events; Last-Event-ID resumes with no gap or duplicate
    POST /v1/tasks/{id}/stream-token  {ttl_seconds?} -> a token for the events URL (?token=, EventSource)
    POST /v1/tasks/{id}/confirm    {call_id, approved, reason?}: the exact pending call, once (else 409)
    POST /v1/tasks/{id}/cancel
    GET  /healthz                  GET /openapi.json

Every request but /healthz and the spec carries `Authorization: Bearer KEY` (an event stream may carry
a stream token instead); a user sees and acts on their own tasks only (another user's task is a 404).
Every error is JSON: {"error": "what to change"}.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, create_model
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether._errors import OperationFailed
from tether.server import _stream_tokens as stream_tokens
from tether.server._console import add_console
from tether.server._events import stream
from tether.server._keys import key_id
from tether.server._tasks import ServiceConfig, TaskError, Tasks

Status = Literal["pending", "running", "awaiting_approval", "completed", "stopped", "error", "cancelled"]


class LimitsIn(BaseModel):
    """Narrower limits for one task (never wider than the agent's own)."""

    model_config = ConfigDict(extra="forbid")
    max_steps: int | None = Field(None, gt=0)
    max_tokens: int | None = Field(None, gt=0)
    max_seconds: float | None = Field(None, gt=0)
    max_cost_usd: float | None = Field(None, gt=0)
    max_tool_calls: int | None = Field(None, gt=0)


class TaskIn(BaseModel):
    prompt: str = Field(min_length=1, description="The task, in the user's words.")
    agent: str = Field(min_length=1, description="A configured agent's name.")
    limits: LimitsIn | None = None
    metadata: dict[str, Any] | None = None


def _task_in(agents: list[str]) -> type[TaskIn]:
    """TaskIn whose `agent` is one of the configured names (so the spec lists them)."""
    choice = Literal.__getitem__(tuple(agents))  # type: ignore[attr-defined]
    return create_model("TaskIn", __base__=TaskIn, agent=(choice, Field(description="A configured agent.")))


class TaskCreated(BaseModel):
    task_id: str
    created: bool


class PendingCall(BaseModel):
    call_id: str
    tool: str
    arguments: dict[str, Any]
    reason: str = ""
    provenance: dict[str, str] = Field(default_factory=dict, description=(
        "Where each argument value came from (path -> user, trusted, untrusted, model, neutral): "
        "information for the approver, never a reason to skip the approval"))
    batch: str = Field("", description=(
        "Set when the call was announced with others of its turn that also need approval: one question for "
        "the group (confirm with `batch: true` to answer every call of it at once)"))
    batch_summary: str = ""


def _pending_call(p: dict[str, Any]) -> PendingCall:
    return PendingCall(call_id=str(p.get("call_id")), tool=str(p.get("tool")), arguments=dict(p.get("arguments") or {}),
                       reason=str(p.get("reason") or ""),
                       provenance={str(k): str(v) for k, v in dict(p.get("provenance") or {}).items()},
                       batch=str(p.get("batch") or ""), batch_summary=str(p.get("batch_summary") or ""))


class TaskOut(BaseModel):
    task_id: str
    agent: str
    status: str
    prompt: str
    stop_reason: str | None
    answer: str | None
    error: str | None
    usage: dict[str, Any]
    steps: int
    findings: list[str]
    pending_approvals: list[PendingCall]
    created_at: float
    updated_at: float


class TaskSummary(BaseModel):
    task_id: str
    agent: str
    status: str
    stop_reason: str | None
    created_at: float


class TaskList(BaseModel):
    tasks: list[TaskSummary]
    next_before: float | None


class ConfirmIn(BaseModel):
    call_id: str = Field(min_length=1)
    approved: bool
    reason: str = ""
    batch: bool = Field(False, description=(
        "Answer every call of the pending call's batch with this one decision (each bound to its own "
        "tool and arguments; counted once by the approval budget)"))


class Confirmed(BaseModel):
    task_id: str
    call_id: str
    approved: bool


class Cancelled(BaseModel):
    task_id: str
    was: str


class StagedChange(BaseModel):
    path: str
    kind: Literal["added", "changed", "deleted"]
    binary: bool
    runs_later: str | None = Field(description="Why this change is code a common tool runs later (then it "
                                   "is applied only when named), or null")
    size_before: int | None
    size_after: int | None


class ChangesOut(BaseModel):
    task_id: str
    status: str = Field(description="staged, applied, partly applied, discarded or undone")
    workspace: str
    changes: list[StagedChange] = Field(description="What the task changed that is not yet in the workspace")
    diff: str


class ApplyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    paths: list[str] | None = Field(None, description="Only these paths (a directory: what is under it); "
                                    "null: every change except code that runs later")


class StageActed(BaseModel):
    task_id: str
    done: list[str]
    skipped: dict[str, str]
    status: str


class StreamTokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ttl_seconds: int = Field(default=3600, ge=1, le=86_400, description="How long the token opens the stream.")


class StreamTokenOut(BaseModel):
    token: str
    expires_at: float
    events_url: str = Field(description="The task's event stream with the token in it, for EventSource.")


class ErrorOut(BaseModel):
    error: str


def _bearer(authorization: str | None) -> str:
    """The API key in an Authorization header ("" without one)."""
    return (authorization or "").removeprefix("Bearer ").strip()


async def user_of(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    """The user an API key acts as; 401 without a valid one."""
    tasks: Tasks = request.app.state.tasks
    key = _bearer(authorization)
    user = await tasks.db(tasks.tables.user_of, key) if key and tasks.tables is not None else None
    if user is None:
        raise TaskError(401, "send a valid API key: Authorization: Bearer KEY (make one with `tether keys add USER`)")
    return user


User = Annotated[str, Depends(user_of)]
STREAM_SECRET = "stream_tokens"
TOKEN_KEY_ID_CHARS = 16  # how much of the asking key's hash a stream token carries
BAD_STREAM_TOKEN = ("this stream token is not for this task, has expired, or its key was revoked: ask for a new one "
                    "(POST /v1/tasks/{task_id}/stream-token)")


async def stream_user(request: Request, task_id: str, authorization: Annotated[str | None, Header()] = None,
                      token: Annotated[str | None, Query(max_length=2000, description=(
                          "A stream token instead of the Authorization header (a browser's EventSource cannot "
                          "send headers)"))] = None) -> str:
    """The user an event stream is opened for: by API key, or by a stream token for this task."""
    if authorization is not None or token is None:
        return await user_of(request, authorization)
    tasks: Tasks = request.app.state.tasks
    asker = stream_tokens.read(await tasks.secret(STREAM_SECRET), token, task_id, time.time())
    user = await tasks.db(tasks.tables.key_owner, asker) if asker and tasks.tables is not None else None
    if user is None:
        raise TaskError(401, BAD_STREAM_TOKEN)
    return user


StreamUser = Annotated[str, Depends(stream_user)]
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorOut} for code in (400, 401, 404, 409, 413, 422, 429)}


class BodyLimit:
    """A request body over `limit` bytes gets a 413, whether its size is declared (Content-Length) or
    only streamed (chunked): the bytes are counted as they arrive, never all read first."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = f"request body over {self.limit} bytes"
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            return await JSONResponse({"error": too_large}, status_code=413)(scope, receive, send)
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:  # FastAPI passes an HTTPException from reading the body through
                    raise StarletteHTTPException(413, too_large)
            return message

        await self.app(scope, counted, send)


def create_app(tasks: Tasks) -> FastAPI:
    """The API over `tasks` (started and stopped with the app)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await tasks.start()
        try:
            yield
        finally:  # uvicorn has closed the listener and the connections (SSE streams end at the signal)
            await tasks.stop()

    app = FastAPI(title="tether task service", version="1", lifespan=lifespan)
    limit = tasks.config.max_body_bytes

    app.add_middleware(BodyLimit, limit=limit)
    if tasks.config.cors_origins:  # added last, so it is outermost: preflights and refusals get its headers
        app.add_middleware(CORSMiddleware, allow_origins=list(tasks.config.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID"])

    @app.exception_handler(TaskError)
    async def task_error(_: Request, exc: TaskError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}" for e in exc.errors()]
        return JSONResponse({"error": "; ".join(parts)}, status_code=422)

    @app.exception_handler(Exception)
    async def bug(_: Request, exc: Exception) -> JSONResponse:  # a bug, not a bad request: say so in JSON
        return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method of the path, not just those of the first route matched
            methods = {m for r in app.routes if r.matches(request.scope)[0] != Match.NONE
                       for m in getattr(r, "methods", None) or ()}
            headers["Allow"] = ", ".join(sorted(methods))
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=headers)

    app.state.tasks = tasks

    @app.get("/healthz", responses={503: {"model": ErrorOut, "description": "The database cannot be reached"}})
    async def healthz() -> Any:
        """Up, and the database answers (a load balancer's check)."""
        try:
            if tasks.tables is None:
                raise OperationFailed("the service has not started")
            await tasks.db(tasks.tables.ping)
        except Exception as exc:
            return JSONResponse({"error": f"the database does not answer: {type(exc).__name__}: {exc}"},
                                status_code=503)
        return {"ok": True, "workers": tasks.config.workers, "agents": tasks.registry.names()}

    async def submit(body: TaskIn, user: User,
                     idempotency_key: Annotated[str | None, Header(max_length=200)] = None) -> Any:
        task_id, created = await tasks.submit(user, body.model_dump(exclude_none=True), idempotency_key)
        return JSONResponse({"task_id": task_id, "created": created}, status_code=201 if created else 200)

    submit.__annotations__["body"] = _task_in(tasks.registry.names())  # the spec lists the agents
    replayed = {200: {"model": TaskCreated, "description": "The task an earlier request with this Idempotency-Key made"}}
    app.post("/v1/tasks", status_code=201, response_model=TaskCreated, responses={**ERRORS, **replayed})(submit)

    @app.get("/v1/tasks", response_model=TaskList, responses=ERRORS)
    async def list_tasks(user: User, status: Status | None = None,
                         limit: Annotated[int, Query(ge=1, le=200)] = 50,
                         before: Annotated[float | None, Query(description="created_at of the last task seen")] = None
                         ) -> TaskList:
        rows = await tasks.list(user, status, limit, before)
        items = [TaskSummary(task_id=r.run_id, agent=r.agent, status=r.status, stop_reason=r.stop_reason,
                             created_at=r.created_at) for r in rows]
        return TaskList(tasks=items, next_before=rows[-1].created_at if len(rows) == limit else None)

    @app.get("/v1/tasks/{task_id}", response_model=TaskOut, responses=ERRORS)
    async def get_task(task_id: str, user: User) -> TaskOut:
        row = await tasks.get(user, task_id)
        findings = await tasks.db(tasks.rt.store.findings, task_id)
        pending = [_pending_call(p) for p in (row.pending.get("batch_calls") or [row.pending])] if row.pending else []
        return TaskOut(task_id=row.run_id, agent=row.agent, status=row.status, prompt=row.prompt,
                       stop_reason=row.stop_reason, answer=row.answer, error=row.error, usage=row.usage,
                       steps=row.steps, findings=findings,
                       pending_approvals=pending, created_at=row.created_at, updated_at=row.updated_at)

    @app.get("/v1/tasks/{task_id}/events", responses={**ERRORS, 200: {"content": {"text/event-stream": {}}, "description": (
        "Server-sent events, each with an id `SEQ.K`: `status`, `text_delta` ({text, restart?}), `model_call`, "
        "`tool_call`, `confirm_request` ({call_id, tool, arguments}), `notice`, `error`, `answer` ({answer, "
        "stop_reason}), `stop`. Send the last id seen as `Last-Event-ID` to resume after it.")}})
    async def events(task_id: str, user: StreamUser,
                     last_event_id: Annotated[str | None, Header(max_length=100)] = None) -> EventSourceResponse:
        await tasks.get(user, task_id)
        return EventSourceResponse(stream(tasks.rt.store, tasks.feed, task_id, last_event_id), ping=15)

    @app.post("/v1/tasks/{task_id}/stream-token", response_model=StreamTokenOut, responses=ERRORS)
    async def stream_token(task_id: str, user: User, authorization: Annotated[str, Header()],
                           body: StreamTokenIn | None = None) -> StreamTokenOut:
        """A token that opens this task's event stream without the Authorization header (for a web
        page's EventSource): `GET events_url`. Valid for `ttl_seconds` or until the key is revoked."""
        await tasks.get(user, task_id)
        expires_at = time.time() + (body or StreamTokenIn()).ttl_seconds
        asker = key_id(_bearer(authorization), TOKEN_KEY_ID_CHARS)
        token = stream_tokens.make(await tasks.secret(STREAM_SECRET), task_id, asker, expires_at)
        return StreamTokenOut(token=token, expires_at=int(expires_at),
                              events_url=f"/v1/tasks/{quote(task_id, safe='')}/events?token={token}")

    @app.post("/v1/tasks/{task_id}/confirm", response_model=Confirmed, responses=ERRORS)
    async def confirm(task_id: str, body: ConfirmIn, user: User) -> Confirmed:
        await tasks.confirm(user, task_id, body.call_id, body.approved, body.reason, batch=body.batch)
        return Confirmed(task_id=task_id, call_id=body.call_id, approved=body.approved)

    @app.get("/v1/tasks/{task_id}/changes", response_model=ChangesOut, responses=ERRORS)
    async def changes(task_id: str, user: User) -> Any:
        """What the task wrote in its staged copy of the workspace and is not yet applied, with a diff."""
        return await tasks.changes(user, task_id)

    @app.post("/v1/tasks/{task_id}/apply", response_model=StageActed, responses=ERRORS)
    async def apply(task_id: str, user: User, body: ApplyIn | None = None) -> Any:
        """Apply an ended task's staged changes to the workspace (all but code that runs later, or the
        paths named); a path changed in the workspace meanwhile is skipped as a conflict."""
        return await tasks.apply(user, task_id, None if body is None else body.paths)

    @app.post("/v1/tasks/{task_id}/undo", response_model=StageActed, responses=ERRORS)
    async def undo(task_id: str, user: User) -> Any:
        """Revert what was applied for the task, as a whole (409 when a path changed since)."""
        return await tasks.undo(user, task_id)

    @app.post("/v1/tasks/{task_id}/discard", response_model=StageActed, responses=ERRORS)
    async def discard(task_id: str, user: User) -> Any:
        """Drop the task's staged changes."""
        return await tasks.discard(user, task_id)

    @app.post("/v1/tasks/{task_id}/cancel", response_model=Cancelled, responses=ERRORS)
    async def cancel(task_id: str, user: User) -> Cancelled:
        return Cancelled(task_id=task_id, was=await tasks.cancel(user, task_id))

    add_console(app, tasks)
    return app


def build_app(database: str | None, agents: str, **config: Any) -> FastAPI:
    """`tether serve`'s app: the database, the agent registry, and ServiceConfig fields."""
    from tether.server._registry import load_registry

    return create_app(Tasks(ServiceConfig(database=database, **config), load_registry(agents)))
