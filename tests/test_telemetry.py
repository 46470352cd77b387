"""OpenTelemetry spans from the typed events (issue 27, item 3): the SDK's in-memory exporter for
names, parents and attributes; a real OTLP/HTTP receiver on 127.0.0.1 for the CLI's export."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from hang import HANG

pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed (pip install 'tether[otel]')")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tether.telemetry
from tether import Agent, tool
from tether.events import OBSERVERS
from tether.models._scripted import ScriptedModel, call

REPO = Path(__file__).resolve().parents[1]


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tether.telemetry.instrument(provider)
    try:
        yield exporter
    finally:
        tether.telemetry.uninstrument()


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans()}


def test_a_run_is_a_span_with_its_model_and_tool_calls_inside(spans: InMemorySpanExporter) -> None:
    model = ScriptedModel([call("add", a=2, b=3), "5"], name="gpt-4o-mini")
    result = Agent(model, tools=[add]).run("What is 2 + 3?")
    got = spans.get_finished_spans()
    assert [s.name for s in got] == ["chat gpt-4o-mini", "execute_tool add", "chat gpt-4o-mini", "invoke_agent agent",
                                     "run agent"]
    run, root = by_name(spans)["invoke_agent agent"], by_name(spans)["run agent"]
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent" and run.attributes["gen_ai.agent.name"] == "agent"
    assert run.attributes["tether.run.id"] == result.run_id and run.attributes["tether.stop_reason"] == "completed"
    assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in got if s not in (run, root))
    assert run.parent is not None and run.parent.span_id == root.context.span_id and root.parent is None
    assert root.attributes["tether.run.id"] == result.run_id and root.attributes["tether.stop_reason"] == "completed"
    assert len({s.context.trace_id for s in got}) == 1
    tool_span = by_name(spans)["execute_tool add"]
    assert tool_span.attributes["gen_ai.tool.name"] == "add"
    assert tool_span.attributes["gen_ai.tool.call.id"] == result.messages[2].tool_call_id
    assert tool_span.attributes["tether.policy.decision"] == "allowed"
    assert "gen_ai.tool.call.arguments" not in tool_span.attributes  # content only when enabled
    chat = got[0]
    assert chat.attributes["gen_ai.request.model"] == "gpt-4o-mini"
    first_call = next(e for e in result.trace if e.kind == "model_call")
    assert chat.attributes["gen_ai.usage.input_tokens"] == first_call.data["input_tokens"]


def test_arguments_are_recorded_only_when_content_capture_is_on() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tether.telemetry.instrument(provider, capture_content=True)
    try:
        Agent(ScriptedModel([call("add", a=2, b=3), "5"]), tools=[add]).run("2 + 3?")
    finally:
        tether.telemetry.uninstrument()
    assert by_name(exporter)["execute_tool add"].attributes["gen_ai.tool.call.arguments"] == '{"a": 2, "b": 3}'


def test_a_continued_run_adds_to_the_same_trace(spans: InMemorySpanExporter) -> None:
    """Two segments of one run (here continued from its state, as a resumed durable run is) share the
    trace the run id names, with no span of the application around them."""
    agent = Agent(ScriptedModel(["first", "second"]), tools=[add])
    first = agent.run("One.")
    agent.run("Two.", state=first.state, run_id=first.run_id)  # the same run, in a later segment
    runs = [s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert len(runs) == 2 and runs[0].context.trace_id == runs[1].context.trace_id
    assert runs[1].attributes["tether.run.resumed"] is True
    other = Agent(ScriptedModel(["x"])).run("Other.")
    assert next(s for s in spans.get_finished_spans() if s.attributes.get("tether.run.id") == other.run_id) \
        .context.trace_id != runs[0].context.trace_id


def test_a_run_inside_an_application_span_is_its_child(spans: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("app", tracer_provider=TracerProvider())
    with tracer.start_as_current_span("POST /ask") as request:
        Agent(ScriptedModel(["hi"])).run("Hello.")
    run = by_name(spans)["invoke_agent agent"]
    assert run.parent is not None and run.parent.span_id == request.get_span_context().span_id
    assert run.context.trace_id == request.get_span_context().trace_id


def _child_under_helper_call(spans: InMemorySpanExporter) -> tuple[tuple[ReadableSpan, ...], ReadableSpan]:
    """Asserts the child's run span hangs under the parent's `helper` call, which hangs under the
    parent's run; returns every span and the parent's run span."""
    got = spans.get_finished_spans()
    runs = [s for s in got if s.name.startswith("invoke_agent")]
    helper_call = by_name(spans)["execute_tool helper"]
    inner, outer = runs  # the child ends first
    assert inner.parent is not None and inner.parent.span_id == helper_call.context.span_id
    assert helper_call.parent is not None and helper_call.parent.span_id == outer.context.span_id
    return got, outer


def test_a_sub_agent_run_hangs_under_the_tool_call_that_started_it(spans: InMemorySpanExporter) -> None:
    child = Agent(ScriptedModel([call("add", a=1, b=1), "2"]), tools=[add])
    parent = Agent(ScriptedModel([call("helper", task="Add 1 and 1."), "It is 2."]), tools=[child.as_tool("helper")])
    parent.run("Ask the helper.")
    got, outer = _child_under_helper_call(spans)
    assert {s.context.trace_id for s in got} == {outer.context.trace_id}


def test_a_durable_sub_agent_run_hangs_under_the_tool_call_that_started_it(spans: InMemorySpanExporter,
                                                                          tmp_path: Path) -> None:
    """A durable parent's child is a workflow of its own, started from the parent's tool step: its
    run span is still a child of that tool call's span, in the same trace."""
    pytest.importorskip("dbos", reason="the durable extra (dbos) is not installed")
    from tether.durable import teardown

    try:
        child = Agent(ScriptedModel([call("add", a=1, b=1), "2"]), tools=[add])
        parent = Agent(ScriptedModel([call("helper", task="Add 1 and 1."), "It is 2."]),
                       tools=[child.as_tool("helper")], name="otel-team", durable=str(tmp_path / "runs.db"))
        assert parent.run("Ask the helper.", run_id="o1").completed
    finally:
        teardown()
    got, outer = _child_under_helper_call(spans)
    assert {s.context.trace_id for s in got if s.name.startswith(("invoke_agent", "execute_tool", "chat"))} \
        == {outer.context.trace_id}


def test_off_means_no_observer_and_a_failing_observer_never_breaks_a_run() -> None:
    assert OBSERVERS == []

    def broken(run_id, event):
        raise RuntimeError("exporter down")

    OBSERVERS.append(broken)
    try:
        result = Agent(ScriptedModel([call("add", a=2, b=3), "5"]), tools=[add]).run("2 + 3?")
    finally:
        if broken in OBSERVERS:
            OBSERVERS.remove(broken)
    assert result.answer == "5"
    assert broken not in OBSERVERS  # dropped after its first failure


class _Collector(BaseHTTPRequestHandler):
    bodies: ClassVar[list[tuple[str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        type(self).bodies.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_the_cli_exports_to_the_otlp_endpoint_in_the_environment(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="tether[otel] is not installed")
    from fake_openai_server import FakeOpenAIServer, chat_completion, tool_call
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    _Collector.bodies = []
    collector = HTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    script = [chat_completion(None, [tool_call("calculator", {"expression": "17 * 23"})]), chat_completion("391")]
    try:
        with FakeOpenAIServer(script) as server:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OPENROUTER_", "TETHER_",
                                                                                "ANTHROPIC_", "OTEL_"))}
            env.update(OPENAI_API_KEY="sk-test", OPENAI_BASE_URL=server.base_url, PYTHONPATH=str(REPO / "src"),
                       TETHER_HOME=str(tmp_path), OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.server_port}",
                       OTEL_SERVICE_NAME="tether-test")
            done = subprocess.run([sys.executable, "-m", "tether.cli", "--tools", "calculator", "-p", "17 * 23?"],
                                  env=env, capture_output=True, text=True, timeout=HANG)
    finally:
        collector.shutdown()
    assert done.returncode == 0 and done.stdout == "391\n", done.stderr
    assert "telemetry" not in done.stderr, done.stderr
    services: set[str] = set()
    for path, body in _Collector.bodies:
        assert path == "/v1/traces"
        for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
            services |= {a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"}
    spans = _exported(_Collector.bodies)
    names = [s.name for s in spans]
    assert sorted(n.split()[0] for n in names) == ["chat", "chat", "execute_tool", "invoke_agent", "run"], names
    assert "execute_tool calculator" in names and services == {"tether-test"}
    # the run's root is exported: every span is in its trace, and the run's segment hangs under it
    (root,) = [s for s in spans if s.name.startswith("run ")]
    (run,) = [s for s in spans if s.name.startswith("invoke_agent")]
    assert root.parent == b"" and run.parent == root.span_id and {s.trace_id for s in spans} == {root.trace_id}
    assert root.attributes["tether.stop_reason"] == "completed" and root.attributes["gen_ai.agent.name"]
    assert run.attributes["gen_ai.agent.name"] == root.attributes["gen_ai.agent.name"]
    assert run.attributes["gen_ai.provider.name"] == "openai"
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert [c.attributes["gen_ai.response.finish_reasons"] for c in chats] == [["tool_calls"], ["stop"]]
    assert {(c.attributes["gen_ai.provider.name"], c.attributes["server.address"]) for c in chats} == \
        {("openai", "127.0.0.1")}
    assert not any(s.error for s in spans)


def test_an_agent_served_over_mcp_joins_the_callers_trace(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    """The MCP client puts the tool call's trace context in the request's _meta; tether's MCP server
    (another process, exporting over OTLP) runs the served agent under it."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="tether[otel] is not installed")
    from fake_openai_server import FakeOpenAIServer, chat_completion
    from mcp_servers.servers import env as child_env
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from tether.mcp import MCPToolset, parse_config

    _Collector.bodies = []
    collector = HTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    try:
        with FakeOpenAIServer([chat_completion("42")]) as model:
            served = {"command": sys.executable,
                      "args": ["-m", "tether", "mcp-serve", "--agent", "mathematician:calculator", "-w", str(tmp_path)],
                      "env": child_env(OPENROUTER_API_KEY="sk-test", OPENROUTER_BASE_URL=model.base_url,
                                       OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.server_port}"),
                      "tether": {"connectTimeout": 60}}
            with MCPToolset(parse_config({"mcpServers": {"m": served}})) as ts:
                assert ts.failures == {}
                Agent(ScriptedModel([call("m__mathematician", task="6 * 7?"), "42"]), tools=ts.tools).run("Ask.")
            # the server exits with the toolset: its batch is flushed at exit
    finally:
        collector.shutdown()
    caller = by_name(spans)["execute_tool m__mathematician"]
    remote = [s for _, body in _Collector.bodies for rs in ExportTraceServiceRequest.FromString(body).resource_spans
              for scope in rs.scope_spans for s in scope.spans if s.name.startswith("invoke_agent")]
    assert len(remote) == 1, _Collector.bodies
    assert int.from_bytes(remote[0].trace_id, "big") == caller.context.trace_id
    assert int.from_bytes(remote[0].parent_span_id, "big") == caller.context.span_id


@dataclass
class Exported:
    """A span as the collector decoded it (opentelemetry-proto)."""

    name: str
    trace_id: bytes
    span_id: bytes
    parent: bytes
    attributes: dict[str, object]
    error: bool
    events: list[str]


def _value(v: object) -> object:
    kind = v.WhichOneof("value")  # type: ignore[attr-defined]
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]  # type: ignore[attr-defined]
    return getattr(v, kind) if kind else None


def _exported(bodies: list[tuple[str, bytes]]) -> list[Exported]:
    """Every span the collector received, decoded."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1.trace_pb2 import Status

    out: list[Exported] = []
    for _, body in bodies:
        for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
            for scope in resource_spans.scope_spans:
                out += [Exported(s.name, s.trace_id, s.span_id, s.parent_span_id,
                                 {a.key: _value(a.value) for a in s.attributes},
                                 s.status.code == Status.STATUS_CODE_ERROR, [e.name for e in s.events])
                        for s in scope.spans]
    return out


def test_a_durable_run_resumed_by_another_process_continues_its_trace(tmp_path: Path) -> None:
    """The task service parks a run on an approval and is stopped; a new service process takes the
    decision and finishes the run. Both processes export to one OTLP collector: the run's two
    segments are in one trace, the second ends the run, the approved call's decision is on its span."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="tether[otel] is not installed")
    pytest.importorskip("dbos")
    pytest.importorskip("fastapi")
    import httpx
    from test_service import Service, wait_status

    _Collector.bodies = []
    collector = HTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    service = Service(tmp_path)
    service.env.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.server_port}",
                       OTEL_SERVICE_NAME="tether-service-test")
    try:
        service.start()
        auth = service.key("alice")
        task = httpx.post(f"{service.url}/v1/tasks", json={"prompt": "charge", "agent": "billing"}, headers=auth, timeout=HANG).json()
        run_id = task["task_id"]
        wait_status(service, auth, run_id, "awaiting_approval")
        service.stop()
        service.start()
        done = httpx.post(f"{service.url}/v1/tasks/{run_id}/confirm", json={"call_id": "c1", "approved": True},
                          headers=auth, timeout=HANG)
        assert done.status_code == 200, done.text
        wait_status(service, auth, run_id, "completed")
        service.stop()
    finally:
        service.stop()
        collector.shutdown()
    every = _exported(_Collector.bodies)
    runs = [s for s in every if s.name.startswith("invoke_agent") and s.attributes.get("tether.run.id") == run_id]
    assert len(runs) == 2, [s.name for s in every]
    trace_id = runs[0].trace_id
    assert runs[1].trace_id == trace_id  # one trace
    spans = [s for s in every if s.trace_id == trace_id]
    # the first segment waited for the decision until its server stopped: interrupted, not cancelled
    assert [r.attributes.get("tether.stop_reason") for r in runs] == ["interrupted", "completed"]
    assert [r.attributes["tether.run.resumed"] for r in runs] == [False, True]  # the second, a recovery
    # one root, exported by the process that ended the run, over both segments
    (root,) = [s for s in spans if s.parent == b""]
    assert root.name == "run billing" and root.attributes["tether.stop_reason"] == "completed"
    assert {r.parent for r in runs} == {root.span_id}
    # the wait for a person is an event of the first segment, and nothing is an error
    assert "tether.awaiting_approval" in runs[0].events and "tether.approval_requested" in runs[0].events
    assert [s.name for s in spans if s.error] == []
    charges = [s for s in spans if s.name == "execute_tool charge"]
    assert [c.attributes["tether.policy.decision"] for c in charges][-1].startswith("approved")
    assert all(r.attributes["gen_ai.agent.name"] == "billing" for r in runs)
    assert service.ledger() == ["charge 99"]


def test_an_approval_wait_is_an_event_not_an_error_and_the_run_that_ends_exports_the_root(
        spans: InMemorySpanExporter) -> None:
    from test_policy_decisions import World

    from tether import StopReason
    from tether.policy import ApprovalBook, PendingApprover, SafetyPolicy

    world = World()
    agent = Agent(ScriptedModel([call("read_email"), call("send_money", recipient="ACME-IBAN-0001", amount=20), "paid"]),
                  tools=world.tools(), policy=SafetyPolicy(approver=PendingApprover(ApprovalBook())), name="payer")
    first = agent.run("pay the invoice in my email")
    assert first.stop_reason is StopReason.AWAITING_APPROVAL
    parked = spans.get_finished_spans()
    assert [s.name for s in parked if s.status.status_code is trace.StatusCode.ERROR] == []
    (segment,) = [s for s in parked if s.name == "invoke_agent payer"]
    assert "tether.awaiting_approval" in [e.name for e in segment.events]
    assert not any(s.name.startswith("run ") for s in parked)  # the run goes on: its root is not exported yet
    done = agent.run(None, state=first.approve(first.pending[0]["call_id"]), run_id=first.run_id)
    assert done.completed
    got = spans.get_finished_spans()
    (root,) = [s for s in got if s.name == "run payer"]
    segments = [s for s in got if s.name == "invoke_agent payer"]
    assert len(segments) == 2 and {s.parent.span_id for s in segments if s.parent} == {root.context.span_id}
    assert [s.name for s in got if s.status.status_code is trace.StatusCode.ERROR] == []


@tool
def boom(path: str) -> str:
    """Always fails."""
    raise OSError(f"no such file: {path}")


def test_a_failed_tool_call_has_an_exception_event_and_an_error_type(spans: InMemorySpanExporter) -> None:
    Agent(ScriptedModel([call("boom", path="x.txt"), "sorry"]), tools=[boom]).run("Read x.txt.")
    failed = by_name(spans)["execute_tool boom"]
    assert failed.status.status_code is trace.StatusCode.ERROR and failed.attributes["error.type"] == "tool_error"
    (exception,) = [e for e in failed.events if e.name == "exception"]
    assert "no such file: x.txt" in str(exception.attributes["exception.message"])


def test_nested_agents_are_told_apart_by_name(spans: InMemorySpanExporter) -> None:
    child = Agent(ScriptedModel(["2"]))
    parent = Agent(ScriptedModel([call("helper", task="Add 1 and 1."), "It is 2."]), tools=[child.as_tool("helper")],
                   name="planner")
    parent.run("Ask the helper.")
    names = {s.attributes["gen_ai.agent.name"] for s in spans.get_finished_spans() if s.name.startswith("invoke_agent")}
    assert names == {"planner", "helper"}


def test_the_root_span_can_be_left_unexported() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tether.telemetry.instrument(provider, export_root=False)
    try:
        Agent(ScriptedModel(["hi"])).run("Hello.")
    finally:
        tether.telemetry.uninstrument()
    assert [s.name for s in exporter.get_finished_spans()] == ["chat scripted", "invoke_agent agent"]


class _Silent(BaseHTTPRequestHandler):
    """A collector that takes the request and never answers (until `released`)."""

    released = threading.Event()

    def do_POST(self) -> None:
        self.released.wait(2 * HANG)  # never, for the test: it is released at the end

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("collector", ["down", "silent"])
def test_a_dead_collector_does_not_hold_the_exit(tmp_path: Path, collector: str) -> None:
    """With the collector down (connection refused) or never answering, the CLI still exits after its
    run, with one warning line and no SDK traceback. The exporter's own timeout is set past the hang
    bound: held by the collector, the exit would take that long (seen: 37 s with a 40 s timeout and
    tether's bound lifted, 9 s with it, at load 20); the figure is measured by bench/console-otel."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="tether[otel] is not installed")
    import socket

    from fake_openai_server import FakeOpenAIServer, chat_completion

    if collector == "down":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # closed again: nothing listens there
        server = None
    else:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Silent)
        server.daemon_threads = True
        port = server.server_port
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with FakeOpenAIServer([chat_completion("hi"), chat_completion("hi")]) as model:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OPENROUTER_", "TETHER_",
                                                                                "ANTHROPIC_", "OTEL_"))}
            env.update(OPENAI_API_KEY="sk-test", OPENAI_BASE_URL=model.base_url, PYTHONPATH=str(REPO / "src"),
                       TETHER_HOME=str(tmp_path), OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                       OTEL_EXPORTER_OTLP_TIMEOUT=str(2 * HANG))  # the exporter alone would outlast the wait below
            done = subprocess.run([sys.executable, "-m", "tether.cli", "-p", "Say hi."], env=env, capture_output=True,
                                  text=True, timeout=HANG)
    finally:
        if server is not None:
            _Silent.released.set()
            server.shutdown()
    assert done.returncode == 0 and done.stdout == "hi\n", done.stderr
    warnings = [line for line in done.stderr.splitlines() if "telemetry" in line]
    assert len(warnings) == 1 and warnings[0].startswith("tether: warning: telemetry:"), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
