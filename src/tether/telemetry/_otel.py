"""Typed run events to OpenTelemetry spans, following the GenAI semantic conventions.

One span per run segment (`invoke_agent`), a child per model call (`chat MODEL`) and per tool call
(`execute_tool NAME`); approvals, notices and errors are span events. Where each span hangs:
- a sub-agent's run (its id is `PARENT:STEP:INDEX.NAME`, `Agent.as_tool`) under the tool call of its
  parent that started it;
- a run started inside another span of the application (a web request) under that span;
- otherwise under a root span context derived from the run id. It is never exported itself, but
  every process that works on one durable run (the first, a recovery, a resume after an approval)
  adds its spans to that same trace.
Tool arguments are recorded only with `capture_content` (or
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`): they may hold personal data.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from tether._errors import TetherError
from tether.events import (
    OBSERVERS,
    ApprovalDecided,
    ApprovalRequested,
    BaseEvent,
    Error,
    FilterVerdict,
    ModelCallEnded,
    ModelCallStarted,
    Notice,
    RunStarted,
    RunStopped,
    ToolCallEnded,
    ToolCallStarted,
)

CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_CHILD_RUN = re.compile(r"^(?P<parent>.+):(?P<step>\d+):(?P<index>\d+)\.[^.:]+$")


class TelemetryUnavailable(TetherError, RuntimeError):
    """OpenTelemetry export was asked for but its packages are not installed."""


@dataclass
class _Run:
    span: Any
    model: Any = None  # the model call in flight
    tools: dict[str, Any] = field(default_factory=dict)  # call id -> span, while it runs
    by_index: dict[tuple[int, int], Any] = field(default_factory=dict)  # (step, index) -> span: sub-agents' parents


class OtelObserver:
    """An event observer (`tether.events.OBSERVERS`) that turns each run's events into spans."""

    def __init__(self, tracer_provider: Any = None, *, capture_content: bool = False) -> None:
        from opentelemetry import trace

        from tether import __version__

        self._trace = trace
        provider = tracer_provider or trace.get_tracer_provider()
        self.tracer = provider.get_tracer("tether", __version__)
        self.capture_content = capture_content
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()  # the service runs many runs on several threads

    def __call__(self, run_id: str, event: BaseEvent) -> None:
        with self._lock:
            if isinstance(event, RunStarted):
                self._runs[run_id] = _Run(self._start_run(run_id, event))
                return
            run = self._runs.get(run_id)
            if run is None:
                return  # started before instrumenting
            self._on(run_id, run, event)

    def _start_run(self, run_id: str, event: RunStarted) -> Any:
        trace = self._trace
        parent = None
        child = _CHILD_RUN.match(run_id)
        holder = self._runs.get(child["parent"]) if child else None
        if child and holder is not None and (span := holder.by_index.get((int(child["step"]), int(child["index"])))):
            parent = trace.set_span_in_context(span)
        elif not trace.get_current_span().get_span_context().is_valid:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(_run_root(run_id)))
        attributes = {"gen_ai.operation.name": "invoke_agent", "tether.run.id": run_id,
                      "tether.run.resumed": event.resumed}
        return self.tracer.start_span("invoke_agent", context=parent, kind=trace.SpanKind.INTERNAL,
                                      attributes=attributes)

    def _on(self, run_id: str, run: _Run, event: BaseEvent) -> None:
        trace = self._trace
        inside = trace.set_span_in_context(run.span)
        match event:
            case ModelCallStarted():
                run.model = self.tracer.start_span(
                    f"chat {event.model}", context=inside, kind=trace.SpanKind.CLIENT,
                    attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": event.model,
                                "tether.purpose": event.purpose, "tether.step": event.step})
            case ModelCallEnded():
                span = run.model or self.tracer.start_span(f"chat {event.model}", context=inside)
                run.model = None
                span.set_attributes({"gen_ai.response.model": event.model,
                                     "gen_ai.usage.input_tokens": event.input_tokens,
                                     "gen_ai.usage.output_tokens": event.output_tokens,
                                     "tether.cost_usd": event.cost_usd, "tether.tool_calls": event.tool_calls})
                span.end()
            case ToolCallStarted():
                attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": event.name,
                                              "gen_ai.tool.call.id": event.call_id, "tether.step": event.step,
                                              "tether.tool.index": event.index}
                if self.capture_content:
                    attributes["gen_ai.tool.call.arguments"] = json.dumps(event.arguments, ensure_ascii=False,
                                                                          default=str)
                span = self.tracer.start_span(f"execute_tool {event.name}", context=inside,
                                              kind=trace.SpanKind.INTERNAL, attributes=attributes)
                run.tools[event.call_id] = span
                run.by_index[(event.step, event.index)] = span
            case ToolCallEnded():
                span = run.tools.pop(event.call_id, None)
                if span is None:  # answered without running (refused, repeated): a zero-length span
                    span = self.tracer.start_span(f"execute_tool {event.name}", context=inside, attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": event.name,
                        "gen_ai.tool.call.id": event.call_id})
                span.set_attributes({"tether.policy.decision": event.decision, "tether.result_chars": event.result_chars,
                                     "tether.truncated": event.truncated})
                if event.is_error:
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
            case Notice():
                run.span.add_event("tether.notice", {k: _attribute(v) for k, v in event.notice.items()})
            case Error():
                run.span.add_event("tether.error", {"error.message": event.error})
            case RunStopped():
                self._stop(run_id, run, event)

    def _stop(self, run_id: str, run: _Run, event: RunStopped) -> None:
        trace = self._trace
        for span in [run.model, *run.tools.values()]:
            if span is not None:  # cut short by the stop (cancelled, a budget, a crash of the call)
                span.set_status(trace.Status(trace.StatusCode.ERROR, f"run stopped: {event.stop_reason}"))
                span.end()
        run.span.set_attributes({"tether.stop_reason": event.stop_reason, "tether.steps": event.steps})
        if event.stop_reason == "error":
            run.span.set_status(trace.Status(trace.StatusCode.ERROR, "the run ended in an error"))
        run.span.end()
        del self._runs[run_id]


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


def instrument(tracer_provider: Any = None, *, capture_content: bool | None = None) -> OtelObserver:
    """Send every run's events to OpenTelemetry as spans (replacing an earlier `instrument`)."""
    global _active
    uninstrument()
    capture = os.environ.get(CAPTURE_ENV, "").lower() == "true" if capture_content is None else capture_content
    try:
        _active = OtelObserver(tracer_provider, capture_content=capture)
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
    batched and flushed at exit. None when neither is set."""
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TelemetryUnavailable("OTEL_EXPORTER_OTLP_ENDPOINT is set but the OTLP exporter is not installed: "
                                   "pip install 'tether[otel]'") from exc
    resource = Resource.create({} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "tether"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    atexit.register(provider.shutdown)  # flushes what is batched
    return instrument(provider)
