"""A real OpenAI-compatible HTTP server on 127.0.0.1 whose replies are scripted by the test.

    with FakeOpenAIServer([chat_completion("hi"), Reply.error(500, "boom")]) as server:
        model = OpenAICompatModel("fake", base_url=server.base_url)
        ...
        server.requests[0].body["messages"]

Each scripted item is served to one request, in order:
- a dict: a chat completion body (see `chat_completion`); sent as JSON, or as SSE chunks when the
  request asked for `"stream": true` (so one script serves both modes);
- a `Reply`: sent exactly as described (status, JSON body or SSE events, headers, delay, dropped
  connection);
- a callable taking the `RecordedRequest` and returning either of the above.
When the script is used up, `responder` (a callable like the above) answers, or a 500 says so.

Any path is answered the same way, so the same server fakes Anthropic's /v1/messages too.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SSEEvent = dict[str, Any] | tuple[str, dict[str, Any]]


@dataclass
class Reply:
    """One raw HTTP answer. `events` makes it an SSE stream; `drop` closes the socket unanswered."""

    status: int = 200
    body: Any = None
    events: list[SSEEvent] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False
    done_marker: bool = True  # send `data: [DONE]` after the SSE events (OpenAI style)

    @classmethod
    def json(cls, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
        return cls(status=status, body=body, headers=headers or {})

    @classmethod
    def error(
        cls, status: int, message: str = "scripted error", headers: dict[str, str] | None = None
    ) -> Reply:
        """An error in the OpenAI shape: {"error": {"message": ..., "type": ...}}."""
        body = {"error": {"message": message, "type": "fake_error", "code": status}}
        return cls(status=status, body=body, headers=headers or {})

    @classmethod
    def sse(cls, events: list[SSEEvent], done_marker: bool = True) -> Reply:
        return cls(events=events, done_marker=done_marker)


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))


Scripted = dict[str, Any] | Reply | Callable[[RecordedRequest], "dict[str, Any] | Reply"]


def tool_call(name: str, arguments: dict[str, Any] | str, id: str | None = "call_1") -> dict[str, Any]:
    """An OpenAI tool call; a str `arguments` is sent verbatim (to script malformed JSON)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
    if id is not None:
        call["id"] = id
    return call


def chat_completion(
    text: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    *,
    prompt_tokens: int = 11,
    completion_tokens: int = 7,
    model: str = "fake-model",
    finish_reason: str | None = None,
    usage: bool = True,
) -> dict[str, Any]:
    """A /v1/chat/completions response body."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
            }
        ],
    }
    if usage:
        body["usage"] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
    return body


def _pieces(s: str, n: int) -> list[str]:
    if not s:
        return []
    size = max(1, -(-len(s) // n))
    return [s[i : i + size] for i in range(0, len(s), size)]


def completion_chunks(
    body: dict[str, Any], pieces: int = 3, include_usage: bool = True
) -> list[dict[str, Any]]:
    """Split a chat completion body into the streaming chunks a real server would send.

    Text and each tool call's arguments arrive in `pieces` parts; tool calls are keyed by index
    with id and name only in their first chunk; usage (if asked for) comes in a last chunk
    with no choices, as OpenAI does with `stream_options.include_usage`.
    """
    base = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    choice = body["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return base | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": p}) for p in _pieces(message.get("content") or "", pieces)]
    for index, call in enumerate(message.get("tool_calls") or []):
        head = {
            "index": index,
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        if "id" in call:
            head["id"] = call["id"]
        chunks.append(chunk({"tool_calls": [head]}))
        for p in _pieces(call["function"]["arguments"], pieces):
            chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage and "usage" in body:
        chunks.append(base | {"choices": [], "usage": body["usage"]})
    return chunks


class FakeOpenAIServer:
    """A threaded HTTP server on a free port of 127.0.0.1; use as a context manager."""

    def __init__(
        self,
        script: Iterable[Scripted] = (),
        *,
        responder: Callable[[RecordedRequest], dict[str, Any] | Reply] | None = None,
    ) -> None:
        self._script: deque[Scripted] = deque(script)
        self.responder = responder
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._httpd = _QuietServer(("127.0.0.1", 0), _make_handler(self))
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (ends in /v1)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        """The server root, for SDKs that add /v1 themselves (Anthropic)."""
        return f"http://127.0.0.1:{self.port}"

    def push(self, *items: Scripted) -> None:
        with self._lock:
            self._script.extend(items)

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._script)

    def start(self) -> FakeOpenAIServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-openai", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(request)
            item: Scripted | None = self._script.popleft() if self._script else self.responder
        if item is None:
            return Reply.error(500, "fake server: no scripted reply left")
        if callable(item) and not isinstance(item, Reply):
            item = item(request)
        if isinstance(item, Reply):
            return item
        if request.stream:
            options = request.body.get("stream_options") or {}
            return Reply.sse(list(completion_chunks(item, include_usage=bool(options.get("include_usage")))))
        return Reply.json(item)


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout tests) leaves a broken pipe behind: expected, not news.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _make_handler(server: FakeOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in separate writes; without this, Nagle + delayed ACK add
            # ~40 ms to every reply.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            pass

        def do_GET(self) -> None:
            self._handle(None)

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            self._handle(body)

        def _handle(self, body: Any) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            reply = server._next(RecordedRequest(self.command, self.path, headers, body))
            if reply.delay:
                time.sleep(reply.delay)
            if reply.drop:
                self.close_connection = True
                return
            if reply.events is not None:
                self._send_sse(reply)
            else:
                self._send_json(reply)

        def _send_json(self, reply: Reply) -> None:
            data = json.dumps(reply.body).encode()
            self.send_response(reply.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in reply.headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _send_sse(self, reply: Reply) -> None:
            self.send_response(reply.status)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("connection", "close")
            for k, v in reply.headers.items():
                self.send_header(k, v)
            self.end_headers()
            assert reply.events is not None
            for event in reply.events:
                if isinstance(event, tuple):
                    name, data = event
                    frame = f"event: {name}\ndata: {json.dumps(data)}\n\n"
                else:
                    frame = f"data: {json.dumps(event)}\n\n"
                self.wfile.write(frame.encode())
                self.wfile.flush()
            if reply.done_marker:
                self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler
