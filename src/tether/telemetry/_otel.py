"""Typed run events to OpenTelemetry spans, following the GenAI semantic conventions.

One span per run segment (`invoke_agent AGENT`), a child per model call (`chat MODEL`) and per tool
call (`execute_tool NAME`); approvals, notices and errors are span events. Where each span hangs:
- a sub-agent's run (its id is `PARENT:STEP:INDEX.NAME`, `Agent.as_tool`) under the tool call of its
  parent that started it;
- a run started inside another span of the application (a web request) under that span;
- otherwise under the run's root span (`run AGENT`), whose ids are derived from the run id: every
  process that works on one durable run (the first, a recovery, a resume after an approval) adds its
  spans to that same trace, and the process that ends the run exports the root, spanning the whole
  run (`export_root=False` or TETHER_OTEL_RUN_ROOT=false: never exported).
A call parked for a person's decision is an event, not an error. Tool arguments are recorded only
with `capture_content` (or `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`): they may
hold personal data.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import hashlib
import json
import logging
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tether._errors import TetherError
from tether._loop import INTERRUPTED
from tether._types import CallDecision
from tether.events import (
    OBSERVERS,
    ApprovalDecided,
    ApprovalRequested,
    BaseEvent,
    Error,
    FilterVerdict,
    JobEnded,
    JobStarted,
    ModelCallEnded,
    ModelCallStarted,
    Notice,
    RunStarted,
    RunStopped,
    ToolCallEnded,
    ToolCallStarted,
)

CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
ROOT_ENV = "TETHER_OTEL_RUN_ROOT"  # "false": do not export the runs' root spans
EXIT_TIMEOUT_ENV = "TETHER_OTEL_EXIT_TIMEOUT"  # seconds the exit waits for the last export (default 0.5)
AWAITING = "awaiting_approval"
_NOT_FINAL = frozenset({AWAITING, INTERRUPTED})  # stops after which the run goes on (in this or another process)
_CHILD_RUN = re.compile(r"^(?P<parent>.+):(?P<step>\d+):(?P<index>\d+)\.(?P<name>[^.:]+)$")


class TelemetryUnavailable(TetherError, RuntimeError):
    """OpenTelemetry export was asked for but its packages are not installed."""


@dataclass
class _Run:
    span: Any
    agent: str = ""
    model: str = ""  # the run's model: its calls get the provider and server below
    origin: dict[str, str] = field(default_factory=dict)
    root: bool = False  # the run hangs under its derived root span, which the run's end exports
    cancel_reason: str = ""
    error_type: str = ""
    call: Any = None  # the model call in flight
    tools: dict[str, Any] = field(default_factory=dict)  # call id -> span, while it runs
    by_index: dict[tuple[int, int], Any] = field(default_factory=dict)  # (step, index) -> span: sub-agents' parents


class OtelObserver:
    """An event observer (`tether.events.OBSERVERS`) that turns each run's events into spans."""

    def __init__(self, tracer_provider: Any = None, *, capture_content: bool = False,
                 export_root: bool = True) -> None:
        from opentelemetry import trace

        from tether import __version__

        self._trace = trace
        provider = tracer_provider or trace.get_tracer_provider()
        self.tracer = provider.get_tracer("tether", __version__)
        self.capture_content = capture_content
        self._root_ids = _FixedIds()
        # The root span's ids are the run's, not random: the SDK's tracer draws them from its id
        # generator, so a copy of the tracer gets one that hands out the run's (None: not the SDK's).
        self._root_tracer: Any = None
        if export_root and hasattr(self.tracer, "id_generator"):
            self._root_tracer = copy.copy(self.tracer)
            self._root_tracer.id_generator = self._root_ids
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()  # the service runs many runs on several threads

    def __call__(self, run_id: str, event: BaseEvent) -> None:
        with self._lock:
            if isinstance(event, RunStarted):
                self._runs[run_id] = self._start_run(run_id, event)
                return
            run = self._runs.get(run_id)
            if run is None:
                return  # started before instrumenting
            self._on(run_id, run, event)

    def _start_run(self, run_id: str, event: RunStarted) -> _Run:
        trace = self._trace
        parent = None
        root = False
        agent = event.agent
        child = _CHILD_RUN.match(run_id)
        if child and agent in ("", "agent"):  # an unnamed sub-agent: the tool's name tells it apart
            agent = child["name"]
        holder = self._runs.get(child["parent"]) if child else None
        if child and holder is not None and (span := holder.by_index.get((int(child["step"]), int(child["index"])))):
            parent = trace.set_span_in_context(span)
        elif not trace.get_current_span().get_span_context().is_valid:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(_run_root(run_id)))
            root = True
        origin = {k: v for k, v in (("gen_ai.provider.name", event.provider),
                                    ("server.address", event.server_address)) if v}
        attributes: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent", "tether.run.id": run_id,
                      "tether.run.resumed": event.resumed, **_agent_attributes(agent)}
        if event.provider:
            attributes["gen_ai.provider.name"] = event.provider
        if event.model:
            attributes["gen_ai.request.model"] = event.model
        span = self.tracer.start_span(f"invoke_agent {agent}".rstrip(), context=parent,
                                      kind=trace.SpanKind.INTERNAL, attributes=attributes)
        return _Run(span, agent=agent, model=event.model, origin=origin, root=root)

    def _on(self, run_id: str, run: _Run, event: BaseEvent) -> None:
        trace = self._trace
        inside = trace.set_span_in_context(run.span)
        match event:
            case ModelCallStarted():
                attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": event.model,
                                              "tether.purpose": event.purpose, "tether.step": event.step}
                if event.model == run.model:
                    attributes.update(run.origin)
                run.call = self.tracer.start_span(f"chat {event.model}", context=inside, kind=trace.SpanKind.CLIENT,
                                                  attributes=attributes)
            case ModelCallEnded():
                span = run.call or self.tracer.start_span(f"chat {event.model}", context=inside,
                                                          kind=trace.SpanKind.CLIENT)
                run.call = None
                span.set_attributes({"gen_ai.response.model": event.model,
                                     "gen_ai.usage.input_tokens": event.input_tokens,
                                     "gen_ai.usage.output_tokens": event.output_tokens,
                                     "tether.cost_usd": event.cost_usd, "tether.tool_calls": event.tool_calls})
                if event.finish_reason:
                    span.set_attribute("gen_ai.response.finish_reasons", [event.finish_reason])
                span.end()
            case ToolCallStarted():
                attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": event.name,
                              "gen_ai.tool.call.id": event.call_id, "tether.step": event.step,
                              "tether.tool.index": event.index}
                if self.capture_content:
                    attributes["gen_ai.tool.call.arguments"] = json.dumps(event.arguments, ensure_ascii=False,
                                                                          default=str)
                span = self.tracer.start_span(f"execute_tool {event.name}", context=inside,
                                              kind=trace.SpanKind.INTERNAL, attributes=attributes)
                run.tools[event.call_id] = span
                run.by_index[(event.step, event.index)] = span
            case ToolCallEnded(decision=CallDecision.AWAITING_APPROVAL):
                # Parked for a person: not a failure, and not a call yet (it runs, as a span of its
                # own, once approved). The wait is an event on the run's span.
                run.span.add_event("tether.awaiting_approval", {"tether.call.id": event.call_id,
                                                                "gen_ai.tool.name": event.name})
                span = run.tools.pop(event.call_id, None)
                if span is not None:
                    span.set_attribute("tether.policy.decision", AWAITING)
                    span.end()
            case ToolCallEnded():
                span = run.tools.pop(event.call_id, None)
                if span is None:  # answered without running (refused, repeated): a zero-length span
                    span = self.tracer.start_span(f"execute_tool {event.name}", context=inside, attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": event.name,
                        "gen_ai.tool.call.id": event.call_id})
                span.set_attributes({"tether.policy.decision": event.decision, "tether.result_chars": event.result_chars,
                                     "tether.truncated": event.truncated})
                if event.is_error:
                    kind = _tool_error_type(event.decision)
                    span.set_attribute("error.type", kind)
                    span.add_event("exception", {"exception.type": kind,
                                                 "exception.message": event.preview or event.decision or kind})
                    span.set_status(trace.Status(trace.StatusCode.ERROR, event.decision or "tool error"))
                span.end()
            case ApprovalRequested():
                run.span.add_event("tether.approval_requested", {"tether.call.id": event.call_id,
                                                                 "gen_ai.tool.name": event.tool,
                                                                 "tether.reason": event.reason})
            case ApprovalDecided():
                run.span.add_event("tether.approval_decided", {"tether.call.id": event.call_id,
                                                               "tether.approved": event.approved, "tether.by": event.by})
            case FilterVerdict():
                run.span.add_event("tether.filter_verdict", {
                    "tether.filter.side": event.side, "tether.filter.score": event.score,
                    "tether.filter.threshold": event.threshold, "tether.filter.flagged": event.flagged,
                    "tether.filter.reasons": list(event.reasons), "tether.filter.matched": list(event.matched),
                    "tether.filter.cached": event.cached})
            case JobStarted() | JobEnded():
                run.span.add_event(f"tether.{event.kind}", {k: _attribute(v) for k, v in event.data.items()})
            case Notice():
                if isinstance(reason := event.notice.get("cancelled"), str):
                    run.cancel_reason = reason
                run.span.add_event("tether.notice", {k: _attribute(v) for k, v in event.notice.items()})
            case Error():
                run.error_type = _error_type(event.error)
                run.span.add_event("exception", {"exception.type": run.error_type, "exception.message": event.error})
            case RunStopped():
                self._stop(run_id, run, event)

    def _stop(self, run_id: str, run: _Run, event: RunStopped) -> None:
        trace = self._trace
        stop = event.stop_reason
        if stop == "cancelled" and run.cancel_reason == INTERRUPTED:
            stop = INTERRUPTED  # its process stopped; it goes on where it was (a recovery, a resume)
        for span in [run.call, *run.tools.values()]:
            if span is not None:  # cut short by the stop (cancelled, a budget, a crash of the call)
                span.set_attribute("error.type", stop)
                span.set_status(trace.Status(trace.StatusCode.ERROR, f"run stopped: {stop}"))
                span.end()
        run.span.set_attributes({"tether.stop_reason": stop, "tether.steps": event.steps})
        if stop == "error":
            run.span.set_attribute("error.type", run.error_type or "error")
            run.span.set_status(trace.Status(trace.StatusCode.ERROR, "the run ended in an error"))
        run.span.end()
        del self._runs[run_id]
        if run.root and self._root_tracer is not None and stop not in _NOT_FINAL:
            self._export_root(run_id, run, stop, event)

    def _export_root(self, run_id: str, run: _Run, stop: str, event: RunStopped) -> None:
        """The run's root span, from its start (`event.t` seconds before its end: the run's clock,
        which a durable run keeps across processes) to now."""
        root = _run_root(run_id)
        end = time.time_ns()
        start = end - int(max(event.t, 0.0) * 1e9)
        self._root_ids.next = (root.trace_id, root.span_id)
        attributes = {"gen_ai.operation.name": "invoke_agent", "tether.run.id": run_id, "tether.stop_reason": stop,
                      "tether.steps": event.steps, **_agent_attributes(run.agent)}
        span = self._root_tracer.start_span(f"run {run.agent}".rstrip(), context=self._trace.set_span_in_context(
            self._trace.INVALID_SPAN), kind=self._trace.SpanKind.INTERNAL, attributes=attributes, start_time=start)
        if stop == "error":
            span.set_attribute("error.type", run.error_type or "error")
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, "the run ended in an error"))
        span.end(end_time=end)


class _FixedIds:
    """An id generator (the SDK's interface) that hands out the ids it was given last."""

    def __init__(self) -> None:
        self.next = (1, 1)

    def generate_trace_id(self) -> int:
        return self.next[0]

    def generate_span_id(self) -> int:
        return self.next[1]

    def is_trace_id_random(self) -> bool:
        return False


def _agent_attributes(agent: str) -> dict[str, str]:
    return {"gen_ai.agent.name": agent} if agent else {}


def _tool_error_type(decision: str) -> str:
    """error.type of a failed tool call: the policy's verdict (refused, denied, timeout, ...), or
    tool_error when the tool ran and failed."""
    kind = decision.split(":", 1)[0]
    return "tool_error" if kind in ("", CallDecision.ALLOWED, CallDecision.APPROVED, CallDecision.FAILED) else kind


def _error_type(message: str) -> str:
    """The exception class in a run's error ("run failed: ValueError: ...")."""
    found = re.match(r"run failed: ([A-Za-z_][\w.]*):", message)
    return found[1] if found else "error"


def _attribute(value: Any) -> Any:
    return value if isinstance(value, str | bool | int | float) else json.dumps(value, default=str)


def _run_root(run_id: str) -> Any:
    """The root span context of a run's trace: its ids derived from the run id."""
    from opentelemetry.trace import SpanContext, TraceFlags

    digest = hashlib.sha256(f"tether-run:{run_id}".encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))


_active: OtelObserver | None = None


def trace_carrier(run_id: str, call_id: str) -> dict[str, str]:
    """W3C trace context (`traceparent`, `tracestate`) of a tool call's span while it runs, for a
    request to another process (tether's MCP client puts it in the request's `_meta`); {} when
    telemetry is off or the call has no span."""
    observer = _active
    if observer is None:
        return {}
    with observer._lock:
        run = observer._runs.get(run_id)
        span = run.tools.get(call_id) if run is not None else None
    if span is None:
        return {}
    from opentelemetry.trace import set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(span))
    return carrier


def attached_from(carrier: object) -> object | None:
    """Make the trace context in `carrier` (a request's `_meta`) current; a token for `detach`, or
    None when there is none or telemetry is off (then nothing is imported)."""
    if _active is None or not isinstance(carrier, dict) or "traceparent" not in carrier:
        return None
    from opentelemetry import context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    found = TraceContextTextMapPropagator().extract({k: v for k, v in carrier.items() if isinstance(v, str)})
    return context.attach(found)


def detach(token: object | None) -> None:
    if token is not None:
        from opentelemetry import context

        context.detach(token)  # type: ignore[arg-type]


def instrument(tracer_provider: Any = None, *, capture_content: bool | None = None,
               export_root: bool | None = None) -> OtelObserver:
    """Send every run's events to OpenTelemetry as spans (replacing an earlier `instrument`).
    `export_root=False` (or TETHER_OTEL_RUN_ROOT=false): the runs' root spans are not exported."""
    global _active
    uninstrument()
    capture = os.environ.get(CAPTURE_ENV, "").lower() == "true" if capture_content is None else capture_content
    root = os.environ.get(ROOT_ENV, "").lower() not in ("false", "0", "no") if export_root is None else export_root
    try:
        _active = OtelObserver(tracer_provider, capture_content=capture, export_root=root)
    except ImportError as exc:
        raise TelemetryUnavailable(f"OpenTelemetry is not installed ({exc.name}): pip install 'tether[otel]'") from exc
    OBSERVERS.append(_active)
    return _active


def uninstrument() -> None:
    global _active
    if _active is not None and _active in OBSERVERS:
        OBSERVERS.remove(_active)
    _active = None


def instrument_from_env() -> OtelObserver | None:
    """With OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) set: export spans there over OTLP/HTTP,
    batched and flushed at exit, which waits TETHER_OTEL_EXIT_TIMEOUT seconds (0.5) at most. An
    export that fails is one warning line on stderr, not the SDK's tracebacks. None when neither is set."""
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TelemetryUnavailable("OTEL_EXPORTER_OTLP_ENDPOINT is set but the OTLP exporter is not installed: "
                                   "pip install 'tether[otel]'") from exc
    warn = _ExportWarning(endpoint)
    sdk_log = logging.getLogger("opentelemetry")  # the exporter's and the batch processor's, and only here
    sdk_log.addHandler(warn)
    sdk_log.propagate = False
    resource = Resource.create({} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "tether"})
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)  # our exit, bounded, below
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    atexit.register(_bounded_shutdown, provider, _exit_timeout(), warn)
    return instrument(provider)


class _ExportWarning(logging.Handler):
    """Takes the OpenTelemetry SDK's log records (retries, tracebacks) and says once, in one line on
    stderr, that spans could not be exported."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(logging.WARNING)
        self.endpoint = endpoint
        self.said = False
        self._said_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        lines = record.getMessage().splitlines()
        self.say(f"could not export spans to {self.endpoint} ({_short(lines[0] if lines else record.levelname)})")

    def say(self, what: str) -> None:
        with self._said_lock:
            if self.said:
                return
            self.said = True
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"tether: warning: telemetry: {what}; spans are dropped\n")
            sys.stderr.flush()


def _short(reason: str) -> str:
    """The SDK's message, as a few words: the exporter's wraps urllib3's exception in its own."""
    if "Connection refused" in reason or "NewConnectionError" in reason:
        return "connection refused"
    if "timed out" in reason.lower() or "Timeout" in reason:
        return "timed out"
    reason = " ".join(reason.split())
    return reason if len(reason) <= 120 else reason[:117] + "..."


def _exit_timeout() -> float:
    try:
        return max(0.0, float(os.environ.get(EXIT_TIMEOUT_ENV, "0.5")))
    except ValueError:
        return 0.5


def _bounded_shutdown(provider: Any, timeout: float, warn: _ExportWarning) -> None:
    """Flush what is batched and shut the exporter down, waiting `timeout` seconds at most: a
    collector that is down or never answers must not hold the process (the exporter's own retries
    and timeout run to 10 s and more). What is left is dropped, with one line saying so."""
    done = threading.Event()

    def shut() -> None:
        with contextlib.suppress(Exception):
            provider.shutdown()
        done.set()

    threading.Thread(target=shut, name="tether-otel-exit", daemon=True).start()
    if not done.wait(timeout):
        warn.say(f"the collector at {warn.endpoint} did not take the last spans within {timeout:g} s")
