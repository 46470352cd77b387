"""The executor: the one path by which any tool runs (loop, MCP, server and evals all call it).

Order for each call: find the tool -> reject malformed arguments -> validate -> policy (authorize,
effect, taint, approvals; see tether.policy) -> idempotency key -> run with a timeout -> shape and
cap the result (full result kept under a handle) -> policy after-hook (taint, labelling) -> trace.
Every failure becomes a `ToolResult` with `is_error=True` and text the model can act on; nothing
a tool or a model does here raises into the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import dataclasses
import functools
import types
from collections.abc import Awaitable, Callable, Generator, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from tether._errors import AwaitingApproval, InvalidInput, InvalidType
from tether._types import CallDecision, ToolCall, ToolResult, ToolSpec
from tether.tools._base import Tool, ToolContext
from tether.tools._context import CancelSignal
from tether.tools._extra import Extras, RunFacts, bound_extras
from tether.tools._jobs import JobNote, is_job, job_tools
from tether.tools._results import (
    DEFAULT_MAX_RESULT_CHARS,
    Results,
    ResultStore,
    ToolOutput,
    cap,
    read_result_tool,
    shape,
)
from tether.tools._schema import ArgumentError
from tether.values._code import HandleInCode, bind_data
from tether.values._conditional import CONDITIONAL_KEY, DISPATCH, INNER_INDEX, Dispatch, bind_condition
from tether.values._decide import job_hides
from tether.values._declare import QUERY_KEY, hides
from tether.values._labels import TRUSTED
from tether.values._store import MAX_VALUE_CHARS, UnknownHandle, ValueStore, values_of


@dataclass(slots=True)
class CallContext:
    """Facts about the run a call belongs to."""

    run_id: str
    user: str | None = None
    step: int = 0
    seconds_left: float | None = None  # the run's remaining time budget, bounds the tool timeout
    extra: Extras = field(default_factory=Extras)  # the caller's own values, by `ExtraKey`; a tool sees them too
    policy_state: Any = None  # the policy's per-run state (Policy.start_run); owned by the run
    bounds: tuple[Bound, ...] = ()  # the capabilities of the runs that delegated this one (a sub-agent's)
    run: RunFacts = field(default_factory=RunFacts)  # tether's own facts about the run (handles, jobs, parent)

    def __post_init__(self) -> None:
        self.extra = bound_extras(self.extra, self.run, "CallContext")  # a dict (the old form) still works


def _own(ctx: CallContext, handle: str) -> None:
    """The run owns a capped result's handle: its `read_result` may read it back."""
    if ctx.run.handles is None:
        ctx.run.handles = set()
    ctx.run.handles.add(handle)


class Bound(Protocol):
    """What a delegating run allows (`Policy.bound_descendants`: `tether.policy.Capabilities` for the
    safety policy, `PolicyBound` for any other): a sub-agent's calls are checked against each of its
    ancestors' before its own policy sees them, so it never gains a capability a run above it lacks.
    `refusal` may be a coroutine. A call a bound requires approval for is asked by a policy that says
    it can (`asks_for_bounds = True`: the safety policy) and refused under any other."""

    def refusal(self, tool: Tool, args: dict[str, Any], user: str | None) -> str | Awaitable[str | None] | None: ...

    def requires_approval(self, tool: Tool) -> bool: ...


# Runs the tool itself (not the checks around it) as one step: the durable runner checkpoints it,
# so a replay gets the recorded result while the policy's checks and after-call update run again
# in the workflow, from that recorded result.
ToolStepFn = Callable[[Callable[[], Awaitable[ToolResult]]], Awaitable[ToolResult]]


async def _direct(run: Callable[[], Awaitable[ToolResult]]) -> ToolResult:
    return await run()


@dataclass(slots=True)
class Verdict:
    """A policy's answer before a call runs."""

    action: Literal["allow", "refuse", "await_approval"] = "allow"
    reason: str = ""
    decision: str = CallDecision.ALLOWED  # label for trace and audit: allowed, approved:alice, refused:taint, ...
    arguments: dict[str, Any] | None = None  # replaced arguments (e.g. redacted); None keeps them


ALLOW = Verdict()


class Policy(Protocol):
    """Every hook the executor and the loop call on the safety layer.

    Every per-run fact lives in the state `start_run` returns, which the run owns (it rides on
    `CallContext.policy_state`, and `dump_state`/`load_state` turn it into JSON and back), so a
    resumed run is exactly as tainted as before. `after_call` is deterministic given (tool,
    result, state). `pending`/`decide` let a person answer an approval out of process. To write
    one, subclass `BasePolicy` (every hook a no-op that allows) and override what you need.
    """

    def start_run(self, run_id: str, user: str | None, user_texts: list[str], tool_outputs: list[str]) -> Any:
        """A fresh per-run state: the user's own messages so far, and earlier turns' tool outputs."""
        ...

    def note_user(self, state: Any, text: str) -> None:
        """A new message from the user in a continued run."""
        ...

    async def before_call(self, tool: Tool, args: dict[str, Any], call: ToolCall, ctx: CallContext) -> Verdict: ...

    def after_call(self, tool: Tool, result: ToolResult, ctx: CallContext) -> ToolResult: ...

    def label_turn(self, state: Any, results: Iterable[ToolResult]) -> str | None:
        """A note for the model after a turn's results (e.g. which are untrusted data), or None."""
        ...

    def finish_run(self, state: Any, answer: str) -> tuple[str, list[Any]]:
        """Filter the final answer as it leaves the run; returns (answer, findings)."""
        ...

    def dump_state(self, state: Any) -> dict[str, Any]:
        """The state as JSON-safe data with a "version" key."""
        ...

    def load_state(self, data: dict[str, Any]) -> Any:
        """The inverse of `dump_state`."""
        ...

    def pending(self, state: Any) -> list[dict[str, Any]]:
        """Calls awaiting a decision: [{"call_id", "tool", "arguments", "reason"}]."""
        ...

    def decide(self, state: Any, call_id: str, approved: bool, by: str, reason: str = "") -> None:
        """Record a decision bound to exactly that pending call, used once."""
        ...

    def bound_descendants(self, ctx: CallContext | None) -> Bound | None:
        """What this policy allows the sub-agents below its run: each of their calls must pass the
        bound too (None: no bound). Optional: a policy without it is bound as `PolicyBound` does."""
        ...

    def is_untrusted_source(self, tool: Tool, state: Any = None) -> bool:
        """Whether `tool`'s output is content someone else wrote (untrusted: it must not steer the run),
        whatever the call's arguments; `state`: the run's state, when the answer depends on it."""
        ...


POLICY_HOOKS = ("start_run", "note_user", "before_call", "after_call", "label_turn", "finish_run", "dump_state",
                "load_state", "pending", "decide", "is_untrusted_source")


class BasePolicy:
    """Every `Policy` hook, each a no-op that allows: subclass it and override what you need."""

    def start_run(self, run_id: str, user: str | None, user_texts: list[str], tool_outputs: list[str]) -> Any:
        return None

    def note_user(self, state: Any, text: str) -> None:
        return None

    async def before_call(self, tool: Tool, args: dict[str, Any], call: ToolCall, ctx: CallContext) -> Verdict:
        return ALLOW

    def after_call(self, tool: Tool, result: ToolResult, ctx: CallContext) -> ToolResult:
        return result

    def label_turn(self, state: Any, results: Iterable[ToolResult]) -> str | None:
        return None

    def finish_run(self, state: Any, answer: str) -> tuple[str, list[Any]]:
        return answer, []

    def dump_state(self, state: Any) -> dict[str, Any]:
        return {}

    def load_state(self, data: dict[str, Any]) -> Any:
        return None

    def pending(self, state: Any) -> list[dict[str, Any]]:
        return []

    def decide(self, state: Any, call_id: str, approved: bool, by: str, reason: str = "") -> None:
        raise InvalidInput(f"no call {call_id!r} awaits approval (this policy asks for none)")

    def bound_descendants(self, ctx: CallContext | None) -> Bound | None:
        """What this policy allows the sub-agents below its run (at any depth), each of whose calls
        must pass it too; `ctx` is this run's (None: a durable child recovered apart from it). The
        default: a call this policy's `before_call` would refuse, or ask a person about, is refused."""
        return PolicyBound(self, ctx)

    def is_untrusted_source(self, tool: Tool, state: Any = None) -> bool:
        """The tool's own declaration (`@tool(untrusted_output=True)`)."""
        return tool.untrusted_output


class PolicyBound:
    """Any policy as a bound on the runs below its own: a descendant's call is put to the policy's
    `before_call` as if its own run made it now, as a question only: asked with a copy of that run's
    state (`scratch_state`), so what `before_call` counts or records for it is dropped and the
    delegating run's own rules (a per-run rate limit) are spent by its own calls alone. Refused when it
    refuses; refused too when it would ask a person, since the person asked would be the delegating
    run's and the call is the sub-agent's."""

    __slots__ = ("ctx", "policy")

    def __init__(self, policy: Policy, ctx: CallContext | None) -> None:
        self.policy = policy
        self.ctx = ctx

    async def refusal(self, tool: Tool, args: dict[str, Any], user: str | None) -> str | None:
        ctx = self.ctx
        if ctx is None:  # a durable sub-agent recovered apart from its ancestor: that policy's fresh run state
            ctx = self.ctx = CallContext(run_id="", user=user)
            ctx.policy_state = self.policy.start_run("", user, [], [])
        asked = dataclasses.replace(ctx, policy_state=scratch_state(self.policy, ctx.policy_state))
        verdict = await self.policy.before_call(tool, dict(args), ToolCall("delegated", tool.name, dict(args)), asked)
        if verdict.action == "refuse":
            return f"a run above this one refuses it ({verdict.reason or verdict.decision})"
        if verdict.action == "await_approval":
            return f"a run above this one would ask a person about it first ({verdict.reason})"
        return None

    def requires_approval(self, tool: Tool) -> bool:
        return False


def scratch_state(policy: Policy, state: Any) -> Any:
    """A copy of a run's policy state that behaves as the run's does and shares nothing with it (a deep
    copy; else, for a state that cannot be copied, the policy's `dump_state`/`load_state` round trip)."""
    if state is None:
        return None
    try:
        return copy.deepcopy(state)
    except Exception:  # a lock, a connection: the policy's own serialisation says what the state is
        return policy.load_state(policy.dump_state(state))


class AllowAll(BasePolicy):
    """No policy: every valid call runs. Opt-in only (`Agent(policy=AllowAll())`), for tests and
    trusted tool sets; the Agent's default is `tether.policy.SafetyPolicy`."""

    def bound_descendants(self, ctx: CallContext | None) -> Bound | None:
        return None  # it refuses nothing


def check_policy(policy: object) -> Policy:
    """`policy` if it has every hook, else one TypeError naming the missing ones."""
    missing = [h for h in POLICY_HOOKS if not callable(getattr(policy, h, None))]
    if missing:
        raise InvalidType(f"{type(policy).__name__} is not a complete Policy: it lacks {', '.join(missing)}. "
                        "Subclass tether.BasePolicy (every hook allows) and override what you need.")
    return policy  # type: ignore[return-value]


@types.coroutine
def _resume(coro: Any, yielded: Any) -> Generator[Any, Any, Any]:
    """Go on awaiting `coro` after its first step (which yielded `yielded`), as `await coro` would
    have: what the task sends or throws in (a cancellation) goes to `coro`, what it yields goes out."""
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            try:
                yielded = coro.throw(exc)
            except StopIteration as done:
                return done.value
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as done:
                return done.value


def _query_tool_of(tools: dict[str, Tool]) -> str | None:
    """The name of the quarantined query tool among `tools` (tether.values.query_tool), if any."""
    return next((name for name, t in tools.items() if t.metadata.get(QUERY_KEY)), None)


def _untrusted_args(ctx: CallContext, call: ToolCall) -> bool:
    store = values_of(ctx.policy_state)
    binding = store.binding(call.id) if store is not None else None
    return binding is not None and binding.label.untrusted


class ToolCancelled(asyncio.CancelledError):
    """A call cancelled while it ran (or before its tool started): still a cancellation, carrying the
    call's truthful answer in `result` (finished after the cancel, stopped, not run, or left running)."""

    def __init__(self, result: ToolResult) -> None:
        super().__init__(result.content)
        self.result = result


_NOT_ENDED = object()  # a cancelled sync tool's thread did not end within the grace
CANCEL_GRACE_SECONDS = 2.0  # how long a cancelled sync tool's thread may take to end and be reported


# What the model is told when the policy stops a call that carries hidden values: fixed texts (never the
# policy's own reason, which may quote the values in forms no mask can list), by decision.
_VALUE_FREE_REASONS = {
    "refused:secret": "it carries a secret value, and this tool is not declared to take secrets "
                      "(@tool(secret_sink=True)); a secret may go only to a tool declared for it",
    "deferred": "it was held for the user to confirm (not done now); tell the user it is waiting for their "
                "confirmation and do not try to do it another way",
}


class _Hooks:
    """A policy's optional hooks, each looked up by name once (`Executor.hooks`): None when it has none."""

    __slots__ = ("announce_min_calls", "announce_turn", "asks_for_bounds", "policy", "secret_source")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.announce_turn: Any = getattr(policy, "announce_turn", None)
        self.announce_min_calls: int = getattr(policy, "announce_min_calls", 0)
        self.asks_for_bounds = bool(getattr(policy, "asks_for_bounds", False))
        reads = getattr(policy, "secret_source", None)
        self.secret_source: Callable[[Tool, dict[str, Any]], Any] | None = reads if callable(reads) else None


class Executor:
    """Runs tool calls. Sync tools go to a bounded thread pool; async tools run on the loop.

    A cancelled call raises `ToolCancelled` (an `asyncio.CancelledError`) carrying its answer: an async
    tool is cancelled the asyncio way; a sync tool's `ToolContext.cancel_event` is set and its thread is
    given `cancel_grace` seconds to end, after which it is reported as left running.
    """

    def __init__(
        self,
        tools: Iterable[Tool],
        *,
        policy: Policy | None = None,
        results: Results | None = None,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
        default_timeout: float | None = 120.0,
        max_workers: int = 8,
        read_result: bool = True,
        cancel_grace: float = CANCEL_GRACE_SECONDS,
    ) -> None:
        self.cancel_grace = cancel_grace
        self.results: Results = results if results is not None else ResultStore()
        self.max_result_chars = max_result_chars
        self.default_timeout = default_timeout
        self.policy: Policy = AllowAll() if policy is None else check_policy(policy)
        self.tools: dict[str, Tool] = {}
        for t in tools:
            if t.name in self.tools:
                raise InvalidInput(f"two tools are named {t.name!r}; tool names must be unique")
            self.tools[t.name] = t
        if any(is_job(t) for t in self.tools.values()):  # an agent with a job tool can check and wait on jobs
            self.tools.update((t.name, t) for t in job_tools() if t.name not in self.tools)
        self._specs = [t.spec for t in self.tools.values()]
        self._specs_with_reader = self._specs
        self._query = _query_tool_of(self.tools)
        if read_result and "read_result" not in self.tools:
            self.tools["read_result"] = reader = read_result_tool(self.results, max_result_chars)
            self._specs_with_reader = [*self._specs, reader.spec]
        self._max_workers = max_workers
        self._pool: ThreadPoolExecutor | None = None
        self._hooks: _Hooks | None = None
        self._hiding: dict[str, tuple[Tool, bool]] = {}  # tool name -> (tool, whether its calls hide); see _hides

    def _hides(self, tool: Tool, args: dict[str, Any]) -> bool:
        """`hides(tool, args)`, kept per tool (its declarations do not change) unless the arguments decide."""
        if tool.metadata.get(QUERY_KEY):
            return hides(tool, args)
        hiding = hides(tool)
        self._hiding[tool.name] = (tool, hiding)
        return hiding

    def hooks(self) -> _Hooks:
        """The policy's optional hooks, looked up once per policy (not on every turn or call); again
        when `policy` is replaced."""
        hooks = self._hooks
        if hooks is None or hooks.policy is not self.policy:
            hooks = self._hooks = _Hooks(self.policy)
        return hooks

    def _abandon_pool(self) -> None:
        """A timed-out sync tool keeps its thread (Python cannot stop it): leave that pool to finish
        what it holds and give the next calls a fresh one, so abandoned calls never take the workers
        the next call needs."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    @property
    def specs(self) -> list[ToolSpec]:
        """What a run that has no capped result yet is told about (a run asks `specs_for`)."""
        return self._specs

    def specs_for(self, has_handles: bool) -> list[ToolSpec]:
        """What the model is told about. `read_result` is advertised once one of the run's results
        was capped, so small models are not tempted by a tool they have no handle for."""
        return self._specs_with_reader if has_handles else self._specs

    def update_tools(self, add: Iterable[Tool] = (), remove: Iterable[str] = ()) -> None:
        """Drop the tools named in `remove`, then add (or replace) `add`; the next model call sees the
        new set (e.g. an MCP server's changed tool list). Fresh containers are swapped in, so a lookup
        racing the update sees the old set or the new one, never half of each."""
        reader = self.tools.get("read_result")
        auto_reader = reader is not None and reader.spec not in self._specs  # added by __init__, advertised late
        gone = set(remove)
        tools = {n: t for n, t in self.tools.items() if n not in gone or (auto_reader and n == "read_result")}
        tools.update((t.name, t) for t in add)
        if any(is_job(t) for t in tools.values()):
            tools.update((t.name, t) for t in job_tools() if t.name not in tools)
        specs = [t.spec for n, t in tools.items() if not (auto_reader and n == "read_result")]
        self._specs, self._specs_with_reader = specs, [*specs, tools["read_result"].spec] if auto_reader else specs
        self.tools = tools
        self._query = _query_tool_of(tools)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def _late(self, call: ToolCall, future: concurrent.futures.Future[Any],
                    cancelled: list[ToolResult | None]) -> Any:
        """After a sync call was cancelled (its context's signal set): its tool's value, or the exception
        it raised, if its thread ends within `cancel_grace` seconds (noted None: that result is late);
        otherwise `_NOT_ENDED`, its answer noted (not run, or left running)."""
        if future.cancel():  # still queued for a worker thread
            cancelled.append(self._error(call, f"'{call.name}' was not run: it was cancelled before it started",
                                         CallDecision.CANCELLED))
            return _NOT_ENDED
        if not future.done():
            ending = asyncio.wrap_future(future)
            with contextlib.suppress(asyncio.CancelledError):  # cancelled again: stop waiting (the first goes on)
                await asyncio.wait({ending}, timeout=self.cancel_grace)
            if not ending.cancel():  # done: its outcome is read from `future` below
                ending.exception()
        if not future.done():
            self._abandon_pool()  # its thread stays busy: the next calls get fresh workers
            cancelled.append(self._error(call, f"'{call.name}' was cancelled while it ran and did not stop within "
                                         f"{self.cancel_grace:g} s: it was left running and may still take effect",
                                         CallDecision.CANCELLED))
            return _NOT_ENDED
        cancelled.append(None)
        return future.result()

    def _reads_secret(self, tool: Tool, args: dict[str, Any]) -> str | None:
        """The secret-bearing source (a `.env` its command names) the policy says this call reads: its
        output is then hidden whole, as a background job's is once delivered."""
        hooks = self._hooks  # `self.hooks()`, its frame only when the policy changed
        reads = (hooks if hooks is not None and hooks.policy is self.policy else self.hooks()).secret_source
        read = reads(tool, args) if reads is not None else (tool.name if tool.declared.secret_output else None)
        return read if isinstance(read, str) else None

    def _error(self, call: ToolCall, text: str, decision: str) -> ToolResult:
        return ToolResult(call.id, call.name, "ERROR: " + text, is_error=True, full_chars=len(text) + 7,
                          decision=decision)

    async def execute(self, call: ToolCall, ctx: CallContext, index: int = 0, step: ToolStepFn = _direct) -> ToolResult:
        """Run one call through every check; never raises (except cancellation). `index` is the
        call's place in its turn (the idempotency key is `run_id:step:index`); `step` runs the tool
        itself (the durable runner checkpoints it there). Handles of hidden values in the arguments
        (tether.values) are replaced by their values first; the policy reads their labels."""
        store = getattr(ctx.policy_state, "values", None)  # `values_of`, inline
        if not isinstance(store, ValueStore) or not store.enabled:
            store = None
        else:
            store.reader = self._query  # a handle's line names the query tool only when the model has it
        try:  # one coroutine a call (the body was a second one, `_execute`)
            checked = self._checked_call(call, ctx, store, index)
            if isinstance(checked, ToolResult):
                return checked
            if ctx.bounds:
                checked = await self._within_bounds(call, ctx, *checked)
                if isinstance(checked, ToolResult):
                    return checked
            tool, args = checked
            binding = store.bindings.get(call.id) if store is not None else None
            quotes_hidden = binding is not None and bool(binding.guarded)  # `quotes_hidden`, fixed once bound
            try:
                verdict = await self.policy.before_call(tool, args, call, ctx)
            except asyncio.CancelledError:  # e.g. while a person was being asked
                raise ToolCancelled(self._error(call, f"'{call.name}' was not run: it was cancelled before it started",
                                                CallDecision.CANCELLED)) from None
            except Exception as exc:  # fail closed: a policy that cannot decide refuses
                return self._error(call, f"'{call.name}' was not run: the policy check failed - {type(exc).__name__}: "
                                   f"{exc}", f"{CallDecision.REFUSED}:policy_error")
            if quotes_hidden and verdict.action != "allow" and binding is not None:
                # The reason may quote the hidden values in forms no mask can list (a host the egress check
                # parsed out of one, a held action's line): the model is told the decision and the handles only.
                refs = ", ".join(f"{p} = {' '.join(r)}" for p, r in binding.used.items())
                known = _VALUE_FREE_REASONS.get(verdict.decision or "")
                verdict = dataclasses.replace(verdict, reason=(
                    f"{verdict.decision or verdict.action} with the hidden values put in ({refs}): "
                    + (known or "the policy's reason is not shown to you because it could quote those values")))
            if verdict.action == "refuse":
                return self._error(call, f"'{call.name}' was not run: {verdict.reason}", verdict.decision)
            if verdict.action == "await_approval":
                return ToolResult(call.id, call.name, f"PENDING: '{call.name}' awaits approval: {verdict.reason}",
                                  is_error=True, decision=CallDecision.AWAITING_APPROVAL)
            if verdict.arguments is not None:
                args = verdict.arguments
            jobs = ctx.run.jobs if ctx.run.jobs is not None and is_job(tool) else None  # (a run with no job tool: None)
            if jobs is not None:  # its run goes on in the background; the call is answered at once
                # a job given untrusted hidden values delivers a result computed from them: untrusted
                from_source = self.policy.is_untrusted_source(tool, ctx.policy_state)
                untrusted_job = from_source or (binding is not None and binding.label.untrusted)
                # hidden once delivered when the call would hide in the foreground (kept whole until then)
                secret = self._reads_secret(tool, args)  # a secret-bearing source it reads (.env)
                hidden = job_hides(store, tool, args, binding, untrusted=from_source, secret_from=secret)
                return jobs.start(call, ctx.step, index, f"{ctx.run_id}:{ctx.step}:{index}", untrusted_job,
                                  functools.partial(self._run_job, tool, args, call, dataclasses.replace(ctx), index,
                                                    hidden is not None), step, hidden=hidden, secret=secret)
            # _run's note on a cancelled call: None when its tool ended after the cancel (the result it
            # returns is late), else the answer of a call that did not finish
            cancelled: list[ToolResult | None] = []
            # an output the policy may hide is kept whole (up to MAX_VALUE_CHARS); capped after, if shown
            limit = tool.max_result_chars or self.max_result_chars
            if store is None or limit >= MAX_VALUE_CHARS:
                hiding = False
            else:  # `hides(tool, args)`: fixed per tool but for the query's (its answer type decides)
                cached = self._hiding.get(call.name)
                hiding = (cached[1] if cached is not None and cached[0] is tool else self._hides(tool, args)) \
                    or self._reads_secret(tool, args) is not None
            token = DISPATCH.set(Dispatch(self.tools, functools.partial(self._inner, ctx=ctx, index=index),
                                          binding.label if binding is not None else TRUSTED)) \
                if tool.metadata.get(CONDITIONAL_KEY) else None  # call_if runs its one call through every check
            try:
                if step is _direct:  # nothing checkpoints the tool: run it without the step wrapper
                    result = await self._run(tool, args, call, ctx, index, cancelled, hiding)
                else:
                    result = await step(functools.partial(self._run, tool, args, call, ctx, index, cancelled, hiding))
            except asyncio.CancelledError:
                if cancelled and cancelled[0] is not None:
                    raise ToolCancelled(cancelled[0]) from None
                if step is _direct:  # _run did not start the tool
                    raise ToolCancelled(self._error(call, f"'{call.name}' was not run: it was cancelled before it "
                                                    "started", CallDecision.CANCELLED)) from None
                raise  # cancelled in the step runner: whether the tool ran is not known here
            finally:
                if token is not None:
                    DISPATCH.reset(token)
            if not result.is_error:
                result.decision = verdict.decision
            if result.handle is not None:  # recorded in the workflow, so a replayed run owns it too
                _own(ctx, result.handle)
            if result.job is not None and (jobs := ctx.run.jobs) is not None:
                jobs.note(result.job)  # from the recorded result: a replay knows what the model was given
                if result.job.get("handle"):  # a job's capped result, now the run's to read back
                    _own(ctx, result.job["handle"])
            try:
                result = self.policy.after_call(tool, result, ctx)
            except Exception as exc:  # fail closed: an unchecked result is not shown to the model
                result = self._error(call, f"'{call.name}' ran, but its result could not be checked by the policy - "
                                     f"{type(exc).__name__}: {exc}", f"{CallDecision.WITHHELD}:policy_error")
            if quotes_hidden and result.is_error and binding is not None:  # a tool's error quoting them
                result.content = binding.mask(result.content)
            if hiding and len(result.content) > limit:  # shown after all: capped now
                result.content, result.handle = cap(result.content, limit, self.results, ctx.user)
                if result.handle is not None:
                    _own(ctx, result.handle)
            if cancelled:  # its tool ended after the call was cancelled: said after the policy's check
                result.content = (f"ERROR: '{call.name}' was cancelled while it ran, then ended with an error: "
                                  f"{result.content.removeprefix('ERROR: ')}" if result.is_error else
                                  f"'{call.name}' finished after it was cancelled: {result.content}")
                raise ToolCancelled(result)
            return result
        finally:
            if store is not None:
                store.bindings.pop(call.id, None)  # the binding of a call that ended before its result was checked

    async def _inner(self, call: ToolCall, *, ctx: CallContext, index: int) -> ToolResult:
        """The one call a call_if runs: every check, as if the model had made it; its result goes only
        into call_if's hidden record, so no note about it reaches the model (which must not learn it ran)."""
        result = await self.execute(call, ctx, index + INNER_INDEX)
        labels = getattr(ctx.policy_state, "labels", None)
        if isinstance(labels, dict):
            labels.pop(call.id, None)
        return result

    async def _checked(self, call: ToolCall, ctx: CallContext, store: ValueStore | None = None,
                       index: int = 0) -> tuple[Tool, dict[str, Any]] | ToolResult:
        """The call's tool and validated arguments (hidden values put in when `store` is given), or the
        error that answers it (an unknown tool, an unknown handle, invalid arguments, a delegating run's
        refusal): every check before the policy's."""
        checked = self._checked_call(call, ctx, store, index)
        if isinstance(checked, ToolResult) or not ctx.bounds:
            return checked
        return await self._within_bounds(call, ctx, *checked)

    def _checked_call(self, call: ToolCall, ctx: CallContext, store: ValueStore | None = None,
                      index: int = 0) -> tuple[Tool, dict[str, Any]] | ToolResult:
        """`_checked` but the delegating runs' bounds (no await: a call in a run without bounds makes no
        coroutine for its checks)."""
        tool = self.tools.get(call.name)
        if tool is None:
            names = ", ".join(self.tools) or "none"
            return self._error(call, f"unknown tool '{call.name}'. Available tools: {names}.", CallDecision.UNKNOWN_TOOL)
        if call.parse_error is not None:
            return self._error(
                call,
                f"invalid arguments for '{call.name}': {call.parse_error}. Call it again with a JSON object "
                "that matches its parameters.",
                CallDecision.INVALID_ARGUMENTS,
            )
        arguments = call.arguments
        if store is not None:
            try:  # never into a code argument (Bash's command): tether.values._code
                if not tool.metadata and not tool.declares.code_args:  # `bind_data` with no code argument
                    arguments = store.bind(call.id, ctx.step, index, call.arguments)
                else:
                    arguments = (bind_condition(store, call.id, ctx.step, index, call.arguments)
                                 if tool.metadata.get(CONDITIONAL_KEY)  # call_if (is_conditional)
                                 else bind_data(store, tool, call.id, ctx.step, index, call.arguments))
            except (UnknownHandle, HandleInCode) as exc:
                return self._error(call, f"'{call.name}' was not run: {exc}.", CallDecision.INVALID_ARGUMENTS)
        try:
            args = tool.validator.validate(arguments)
        except ArgumentError as exc:
            binding = store.binding(call.id) if store is not None else None
            if binding is not None and binding.quotes_hidden:  # its details would quote the hidden values
                refs = ", ".join(f"{p} = {' '.join(r)}" for p, r in binding.used.items())
                return self._error(call, f"invalid arguments for '{call.name}': with the hidden values put in ({refs}) "
                                   "they do not fit its parameters (details not shown: they would quote the "
                                   "values). A handle stands for text, or for the JSON part it names.",
                                   CallDecision.INVALID_ARGUMENTS)
            return self._error(
                call, f"invalid arguments for '{call.name}': {exc}. Fix them and call the tool again.",
                CallDecision.INVALID_ARGUMENTS,
            )
        except Exception as exc:  # a validator bug must not crash the run, nor let the call through
            return self._error(call, f"arguments for '{call.name}' could not be checked - {type(exc).__name__}: "
                               f"{exc}", CallDecision.INVALID_ARGUMENTS)
        return tool, args

    async def _within_bounds(self, call: ToolCall, ctx: CallContext, tool: Tool,
                             args: dict[str, Any]) -> tuple[Tool, dict[str, Any]] | ToolResult:
        """The call checked against the capabilities of the runs that delegated to this one."""
        for bound in ctx.bounds:
            try:
                reason = bound.refusal(tool, args, ctx.user)
                if not isinstance(reason, str | None):  # a coroutine (PolicyBound)
                    reason = await reason
                if reason is None and bound.requires_approval(tool) and not self.hooks().asks_for_bounds:
                    reason = (f"the task that delegated this one requires a person's approval for '{call.name}', "
                              "which this agent's policy cannot ask for")
            except Exception as exc:  # fail closed
                reason = f"the delegating run's capability check failed - {type(exc).__name__}: {exc}"
            if reason is not None:
                return self._error(call, f"'{call.name}' was not run: {reason}", f"{CallDecision.REFUSED}:delegating_run")
        return tool, args

    async def announce(self, calls: list[ToolCall], ctx: CallContext) -> list[dict[str, Any]]:
        """Tell the policy the calls one model turn announced, before any runs (`announce_turn`: it may
        ask one question for those that need approval). Returns the decisions it took now; never raises
        (a failure leaves each call to ask on its own)."""
        hooks = self._hooks
        if hooks is None or hooks.policy is not self.policy:  # (`hooks()`, one frame less a turn)
            hooks = self.hooks()
        hook = hooks.announce_turn
        if hook is None:
            return []
        items = []
        # a policy that only ever groups `announce_min_calls` or more (SafetyPolicy: 2) is told of a
        # smaller turn without its calls, which it would not read: each is checked once, when it runs
        if len(calls) >= hooks.announce_min_calls:
            store = values_of(ctx.policy_state)
            for index, call in enumerate(calls):
                # hidden values put in as when the call runs, so the question judges the values' labels too
                checked = await self._checked(call, ctx, store, index)
                if not isinstance(checked, ToolResult):
                    items.append((*checked, call))
        try:
            return list(await hook(items, ctx))
        except asyncio.CancelledError:
            raise
        except Exception:
            return []

    async def _run_job(self, tool: Tool, args: dict[str, Any], call: ToolCall, ctx: CallContext,
                       index: int, hiding: bool = False) -> ToolResult:
        """A job's run: `_run`, its cancellation carrying the job's truthful answer (`ToolCancelled`)."""
        cancelled: list[ToolResult | None] = []
        try:
            result = await self._run(tool, args, call, ctx, index, cancelled, hiding)
        except asyncio.CancelledError:
            if cancelled and cancelled[0] is not None:
                raise ToolCancelled(cancelled[0]) from None
            raise
        if cancelled:  # its thread ended within the grace, after the cancel
            result.content = f"'{call.name}' finished after it was cancelled: {result.content}"
            raise ToolCancelled(result)
        return result

    async def _run(self, tool: Tool, args: dict[str, Any], call: ToolCall, ctx: CallContext, index: int,
                   cancelled: list[ToolResult | None] | None = None, hiding: bool = False) -> ToolResult:
        """Run the tool itself, bounded by its timeout. A cancelled call is noted in `cancelled`: a sync
        tool whose thread ends within the grace returns its (late) result, noted None; otherwise the
        call's answer is noted and the cancellation goes on."""
        signal: CancelSignal | None = None
        if tool.context_param is not None:
            args = dict(args)
            signal = CancelSignal()
            # run_id:step:index, not call.id: call ids are only unique within one reply
            args[tool.context_param] = ToolContext(
                run_id=ctx.run_id, call_id=call.id, user=ctx.user,
                idempotency_key=f"{ctx.run_id}:{ctx.step}:{index}", extra=ctx.extra, cancel_event=signal,
                untrusted_args=_untrusted_args(ctx, call), run=ctx.run,
            )
        timeout = tool.timeout if tool.timeout is not None else self.default_timeout
        if ctx.seconds_left is not None:
            timeout = ctx.seconds_left if timeout is None else min(timeout, ctx.seconds_left)
        try:
            if tool.is_async:
                work = tool.fn(**args)
                if timeout is None:
                    value = await work
                elif type(work) is types.CoroutineType:
                    # Stepped once directly: a coroutine that finishes without suspending (a cache hit,
                    # a computation) gave the loop no chance to interrupt it, so it needs no timer. One
                    # that suspends goes on under a timer due when it would have been had it been armed
                    # before that first step.
                    deadline = asyncio.get_running_loop().time() + timeout
                    try:
                        first = work.send(None)
                    except StopIteration as done:
                        value = done.value
                    else:
                        async with asyncio.timeout_at(deadline):
                            value = await _resume(work, first)
                else:
                    async with asyncio.timeout(timeout):
                        value = await work
            else:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._max_workers, thread_name_prefix="tether-tool")
                future = self._pool.submit(functools.partial(tool.fn, **args))
                try:
                    # asyncio.timeout schedules one timer handle; wait_for would create a task per call.
                    async with asyncio.timeout(timeout):
                        value = await asyncio.wrap_future(future)
                except asyncio.CancelledError:  # not the timeout's own: that one leaves as TimeoutError
                    if signal is not None:
                        signal.set()
                    if cancelled is None:
                        raise
                    value = await self._late(call, future, cancelled)
                    if value is _NOT_ENDED:
                        raise
        except TimeoutError:
            if signal is not None:
                signal.set()  # abandoned, but a tool that watches its context can still stop
            if not tool.is_async:
                self._abandon_pool()
            return self._error(
                call, f"tool '{call.name}' timed out after {timeout:g} s and was abandoned. Try a smaller "
                "request or another approach.", CallDecision.TIMEOUT,
            )
        except asyncio.CancelledError:
            if tool.is_async:  # (a sync call's cancellation was handled where it waited)
                if signal is not None:
                    signal.set()
                if cancelled is not None:
                    cancelled.append(self._error(call, f"'{call.name}' was cancelled while it ran and was stopped "
                                                 "before it finished", CallDecision.CANCELLED))
            raise
        except AwaitingApproval as exc:  # its work waits for a person (a sub-agent parked on an approval)
            return ToolResult(call.id, call.name, f"PENDING: {exc}", is_error=True, decision=CallDecision.AWAITING_APPROVAL,
                              parked=exc.parked)
        except Exception as exc:
            return self._error(call, f"tool failed - {type(exc).__name__}: {exc}", CallDecision.FAILED)
        untrusted = job = None
        if type(value) is ToolOutput:  # final: no subclass to look for
            value, untrusted = value.value, value.untrusted
        elif type(value) is JobNote:  # job_status / job_wait: the job as the model now knows it
            untrusted, job, value = value.untrusted or None, value.job or None, value.text
        if type(value) is str:  # shape(value), without its frame for the usual text
            text = value
        else:
            try:
                text = shape(value)
            except Exception as exc:  # e.g. a model_dump() or __str__ that raises
                return self._error(call, f"tool result could not be turned into text - {type(exc).__name__}: {exc}",
                                   CallDecision.FAILED)
        limit = MAX_VALUE_CHARS if hiding else tool.max_result_chars or self.max_result_chars
        content, handle = (text, None) if len(text) <= limit else cap(text, limit, self.results, ctx.user)
        return ToolResult(call.id, call.name, content, handle=handle, full_chars=len(text), untrusted=untrusted,
                          job=job)
