"""Any OpenAI-compatible chat completions server: OpenAI, OpenRouter, vLLM, Ollama, llama.cpp.

Where the base URL and key come from (first match wins, field by field):

1. the `base_url=` / `api_key=` arguments;
2. if OPENAI_BASE_URL or OPENAI_API_KEY is set: those two (base URL defaulting to OpenAI's);
3. else if OPENROUTER_BASE_URL or OPENROUTER_API_KEY is set: those two (base URL defaulting to
   https://openrouter.ai/api/v1), as OpenRouter and the CodeCrafters "Build your own Claude Code"
   course use;
4. else OpenAI's base URL.

A key from the environment is sent only to the URL it was configured with: `base_url=` naming
another server gets `api_key=` or no key. A server other than api.openai.com with no key
(llama.cpp, Ollama, vLLM) gets a placeholder key;
api.openai.com without a key is an error at construction. `OpenAICompatModel.from_env()` also
picks the model: its argument, else TETHER_MODEL, else gpt-4o-mini (OpenAI) or
anthropic/claude-haiku-4.5 (OpenRouter).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import openai
from openai import AsyncStream
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tether._errors import InvalidInput
from tether._types import (
    Message,
    ModelReply,
    ModelRequest,
    OutputSchema,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
)
from tether.models._base import ModelError
from tether.models._loop_client import LoopClient
from tether.models._retry import (
    DEFAULT_DEADLINE,
    DEFAULT_IDLE_TIMEOUT,
    Failure,
    RetryPolicy,
    call_with_retries,
    classify_sdk_error,
    one_line,
    provider_message,
    stream_with_retries,
)

OPENAI_BASE_URL = "https://api.openai.com/v1"
OPENROUTER_BASE_URL = "https://openrouter.ai/api/v1"
NO_KEY = "no-key"  # local servers ignore the key, but the SDK wants one
DEFAULT_MODELS = {"openai": "gpt-4o-mini", "openrouter": "anthropic/claude-haiku-4.5"}

_FIX_HINT = "send one JSON object matching the tool's parameters schema"

# `client.chat.completions.create` deep-walks the whole request through the SDK's TypedDict
# transform: ~50 ms for a 150-message history on our machines, more than the HTTP round trip to a
# local server. Our dicts are already wire-ready, so post them with `client.post` (the SDK's
# documented escape hatch); newer SDKs gate the bearer header on a per-request `security` option.
_POST_OPTIONS: Any = (
    {"security": {"bearer_auth": True}} if "security" in openai.RequestOptions.__annotations__ else {}
)
_STREAM_CLS = AsyncStream[ChatCompletionChunk]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A resolved server: base URL, key, and which family of settings they came from."""

    base_url: str
    api_key: str
    family: str  # "openai" | "openrouter" | "default" | "custom" (a base URL no env key belongs to)


def same_url(a: str, b: str) -> bool:
    """Whether two base URLs name the same endpoint (trailing slashes and case of scheme/host aside)."""
    def norm(u: str) -> str:
        scheme, sep, rest = u.strip().rstrip("/").partition("://")
        if not sep:
            return u.strip().rstrip("/")
        host, slash, path = rest.partition("/")
        return f"{scheme.lower()}://{host.lower()}{slash}{path}"
    return norm(a) == norm(b)


def resolve_endpoint(
    base_url: str | None = None, api_key: str | None = None, env: Mapping[str, str] | None = None
) -> Endpoint:
    """Apply the precedence in the module docstring. Raises ValueError if OpenAI has no key.

    A key from the environment goes only to the URL it was configured with: a `base_url` naming
    another server is a "custom" endpoint, with `api_key` or no key at all (and no family default
    model), so `--base-url X` never hands X the OpenRouter or OpenAI key.
    """
    env = os.environ if env is None else env
    if env.get("OPENAI_BASE_URL") or env.get("OPENAI_API_KEY"):
        family, env_url, env_key = (
            "openai",
            env.get("OPENAI_BASE_URL") or OPENAI_BASE_URL,
            env.get("OPENAI_API_KEY"),
        )
    elif env.get("OPENROUTER_BASE_URL") or env.get("OPENROUTER_API_KEY"):
        family = "openrouter"
        env_url, env_key = (
            env.get("OPENROUTER_BASE_URL") or OPENROUTER_BASE_URL,
            env.get("OPENROUTER_API_KEY"),
        )
    else:
        family, env_url, env_key = "default", OPENAI_BASE_URL, None
    if base_url and not same_url(base_url, env_url):
        family, env_key = "custom", None
    url = (base_url or env_url).rstrip("/")
    key = api_key or env_key
    if not key:
        if same_url(url, OPENAI_BASE_URL):
            raise InvalidInput(
                "no API key for api.openai.com: pass api_key=, set OPENAI_API_KEY, or set "
                "OPENROUTER_API_KEY (OpenRouter) or OPENAI_BASE_URL (a local server)"
            )
        key = NO_KEY
    return Endpoint(url, key, family)


class OpenAICompatModel:
    """A `Model` over /chat/completions with the official `openai` SDK.

    Structured output goes out as `response_format` (a JSON schema); for a server without it set
    `native_output = False` on the model and a final-result tool is used instead.

    The SDK's own retries are off; this adapter retries 408, 429, 5xx, timeouts and connection
    errors `max_retries` times with exponential backoff (`backoff_base` * 2**n, capped at
    `backoff_max`, with jitter; a server's Retry-After wins), then raises `ModelError`. Other
    4xx fail at once. `timeout` bounds each read; `idle_timeout` (60 s) bounds each wait for
    progress, counted in whole units: a reply that is not streamed must arrive complete within it,
    and a stream's response and then each complete stream event too, so a server trickling bytes
    that never complete one stops there (a stall, retried like a timeout); `deadline` bounds the
    whole call, retries and every streamed chunk included. None for either: no such bound.
    `stream_usage` asks for token usage in streams (`stream_options`); turn it off for servers
    that reject that field.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        client: openai.AsyncOpenAI | None = None,
        extra_body: dict[str, Any] | None = None,
        temperature: float | None = None,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        stream_usage: bool = True,
        env: Mapping[str, str] | None = None,
        deadline: float | None = DEFAULT_DEADLINE,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
    ) -> None:
        if not model:
            raise InvalidInput("model name is required, e.g. OpenAICompatModel('gpt-4o-mini')")
        self.model = model
        self.name = model
        self.timeout = timeout
        self.extra_body = extra_body
        self.temperature = temperature
        self.stream_usage = stream_usage
        self.policy = RetryPolicy(max_retries=max_retries, backoff_base=backoff_base, backoff_max=backoff_max,
                                  deadline=deadline, idle_timeout=idle_timeout)
        self._sleep = asyncio.sleep
        if client is not None:
            self._given_client: openai.AsyncOpenAI | None = client.with_options(max_retries=0)
            self.base_url = str(client.base_url).rstrip("/")
            self._api_key = client.api_key
        else:
            self._given_client = None
            endpoint = resolve_endpoint(base_url, api_key, env)
            self.base_url, self._api_key = endpoint.base_url, endpoint.api_key
        # OpenAI's newest models refuse `max_tokens`; most other servers only know it.
        self._max_tokens_key = "max_completion_tokens" if self.base_url == OPENAI_BASE_URL else "max_tokens"
        self._clients = LoopClient(lambda: openai.AsyncOpenAI(
            api_key=self._api_key, base_url=self.base_url, timeout=self.timeout, max_retries=0))
        self._prefix = f"model {model!r} at {self.base_url}"

    native_output = True  # renders ModelRequest.output_schema (tether._output)

    @classmethod
    def from_env(
        cls, model: str | None = None, *, env: Mapping[str, str] | None = None, **kwargs: Any
    ) -> OpenAICompatModel:
        """Build from the environment (precedence in the module docstring)."""
        env = os.environ if env is None else env
        endpoint = resolve_endpoint(kwargs.pop("base_url", None), kwargs.pop("api_key", None), env)
        name = (
            model or env.get("TETHER_MODEL") or DEFAULT_MODELS.get(endpoint.family, DEFAULT_MODELS["openai"])
        )
        return cls(name, base_url=endpoint.base_url, api_key=endpoint.api_key, env=env, **kwargs)

    def __repr__(self) -> str:
        return f"OpenAICompatModel({self.model!r}, base_url={self.base_url!r})"

    async def aclose(self) -> None:
        """Close the HTTP client this event loop opened (a synchronous `Agent.run` calls it before
        its loop ends)."""
        await self._clients.aclose()

    def _get_client(self) -> openai.AsyncOpenAI:
        if self._given_client is not None:
            return self._given_client
        client: openai.AsyncOpenAI = self._clients.get()
        return client

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        params: dict[str, Any] = {"model": self.model, "messages": to_openai_messages(request.messages)}
        if request.tools:
            params["tools"] = to_openai_tools(request.tools)
            choice = tool_choice_name(request)
            if choice is not None:
                params["tool_choice"] = (choice if choice in ("auto", "none", "required")
                                         else {"type": "function", "function": {"name": choice}})
        if request.max_output_tokens is not None:
            params[self._max_tokens_key] = request.max_output_tokens
        temperature = request.temperature if request.temperature is not None else self.temperature
        if temperature is not None:
            params["temperature"] = temperature
        if request.stop:
            params["stop"] = list(request.stop)
        if request.output_schema is not None:
            params["response_format"] = to_response_format(request.output_schema)
        if self.extra_body:
            params.update(self.extra_body)
        return params

    async def _post(self, client: openai.AsyncOpenAI, params: dict[str, Any], stream: bool) -> Any:
        return await client.post(
            "/chat/completions",
            cast_to=ChatCompletion,
            body=params,
            options=_POST_OPTIONS,
            stream=stream,
            stream_cls=_STREAM_CLS,
        )

    def _classify(self, exc: Exception) -> Failure | None:
        return classify_openai_error(exc, self.timeout)

    async def complete(self, request: ModelRequest) -> ModelReply:
        params = self._params(request)
        client = self._get_client()

        async def once() -> Any:
            return await self._post(client, params, False)

        response = await call_with_retries(once, self.policy, self._classify, self._prefix, self._sleep)
        return reply_from_completion(response, self.model, self._prefix)

    async def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | ModelReply]:
        """Stream text as it arrives, then one ModelReply with tool calls and usage.

        Failures before the first text delta are retried like `complete`; once text has been
        yielded a broken stream raises ModelError (the caller already showed that text).
        """
        params = self._params(request)
        params["stream"] = True
        if self.stream_usage:
            params["stream_options"] = {"include_usage": True}
        client = self._get_client()
        async for item in stream_with_retries(
            lambda: self._post(client, params, True), lambda: StreamState(self.model), self.policy, self._classify, self._prefix, self._sleep
        ):
            yield item


def classify_openai_error(exc: Exception, timeout: float | None = None) -> Failure | None:
    """Sort an openai SDK exception into retryable or not, with a one-line message."""
    return classify_sdk_error(openai, openai.OpenAIError, exc, timeout)


# ----- tether -> OpenAI ----------------------------------------------------------------------------


def to_openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    return [to_openai_message(m) for m in messages]


def to_openai_message(m: Message) -> dict[str, Any]:
    role = m.role
    if role == "assistant":
        # content "" rather than None: llama.cpp's server answers 500 to a null content.
        out: dict[str, Any] = {"role": "assistant", "content": m.content or ""}
        if m.tool_calls:
            out["tool_calls"] = [_tool_call_out(c) for c in m.tool_calls]
        return out
    if role == "tool":
        if not m.tool_call_id:
            raise InvalidInput(
                f"tool message without tool_call_id (name={m.name!r}); every tool result needs its call id"
            )
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    if role == "user" or role == "system":
        return {"role": role, "content": m.content}
    raise InvalidInput(f"unknown message role {role!r}; expected system, user, assistant or tool")


def _tool_call_out(call: ToolCall) -> dict[str, Any]:
    # A call whose arguments did not parse goes back as "{}": servers that parse the history's
    # arguments (llama.cpp templates) fail on invalid JSON; the tool result carries the error.
    args = "{}" if call.parse_error else json.dumps(call.arguments, ensure_ascii=False)
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": args}}


def to_response_format(out: OutputSchema) -> dict[str, Any]:
    """Structured output as OpenAI's `response_format` (strict only when the schema allows it)."""
    spec: dict[str, Any] = {"name": out.name, "schema": out.schema, "strict": out.strict}
    if out.description:
        spec["description"] = out.description
    return {"type": "json_schema", "json_schema": spec}


def to_openai_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


TOOL_CHOICES = ("auto", "none", "required")


def tool_choice_name(request: ModelRequest) -> str | None:
    """The request's tool choice, checked: None, one of TOOL_CHOICES, or the name of one of its tools.
    Raises ValueError for a name the request offers no tool for (a bug in the caller, not the model)."""
    choice = request.tool_choice
    if choice is None or choice in TOOL_CHOICES:
        return choice
    if not any(t.name == choice for t in request.tools):
        offered = ", ".join(t.name for t in request.tools) or "none"
        raise InvalidInput(f"tool_choice {choice!r} is neither auto, none, required nor one of the request's "
                         f"tools ({offered})")
    return choice


# ----- OpenAI -> tether ----------------------------------------------------------------------------


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def parse_arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    """Arguments string -> (dict, None), or ({}, a message the model can act on). Never raises."""
    if isinstance(raw, dict):  # some servers send an object instead of a JSON string
        return raw, None
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None  # no-argument tools often come back with ""
    if not isinstance(raw, str):
        return {}, f"arguments must be a JSON object, got {type(raw).__name__}; {_FIX_HINT}"
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return {}, f"arguments were not valid JSON ({exc}); {_FIX_HINT}"
    if not isinstance(value, dict):
        return {}, f"arguments must be a JSON object, got {_json_type(value)}; {_FIX_HINT}"
    return value, None


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return "a number"


def make_tool_call(call_id: str | None, name: str | None, raw: Any, seen: set[str]) -> ToolCall:
    """A ToolCall from wire parts; missing or repeated ids get a fresh one (ids must be unique)."""
    if not call_id or call_id in seen:
        call_id = new_call_id()
    seen.add(call_id)
    arguments, error = parse_arguments(raw)
    if error is None:
        return ToolCall(call_id, name or "", arguments)
    return ToolCall(
        call_id, name or "", {}, parse_error=error, raw_arguments=raw if isinstance(raw, str) else repr(raw)
    )


def _usage(u: Any) -> Usage:
    if u is None:
        return Usage()
    details = getattr(u, "prompt_tokens_details", None)  # cached prompt tokens (OpenAI, vLLM, OpenRouter)
    cost = getattr(u, "cost", None)  # the provider's own bill in USD (OpenRouter), charged if above the table's
    return Usage(
        input_tokens=getattr(u, "prompt_tokens", 0) or 0,
        output_tokens=getattr(u, "completion_tokens", 0) or 0,
        cached_input_tokens=(getattr(details, "cached_tokens", 0) or 0) if details is not None else 0,
        cost_usd=float(cost) if isinstance(cost, int | float) and cost > 0 else 0.0,
    )


def reply_from_completion(response: Any, default_model: str, prefix: str = "model") -> ModelReply:
    """A ChatCompletion (SDK object) -> ModelReply."""
    choices = getattr(response, "choices", None)
    if not choices:
        # OpenRouter and some proxies answer 200 with {"error": {...}} and no choices.
        extra = getattr(response, "model_extra", None) or {}
        detail = provider_message(extra) or "no choices in the response"
        raise ModelError(f"{prefix}: {one_line(detail)}")
    choice = choices[0]
    message = choice.message
    calls: list[ToolCall] = []
    if message.tool_calls:
        seen: set[str] = set()
        for tc in message.tool_calls:
            fn = getattr(tc, "function", None)
            if fn is None:  # a non-function ("custom") tool call: we never declare those
                calls.append(make_tool_call(tc.id, getattr(tc, "type", ""), None, seen))
                calls[-1].parse_error = f"unsupported tool call type {getattr(tc, 'type', '?')!r}"
                continue
            calls.append(make_tool_call(tc.id, fn.name, fn.arguments, seen))
    return ModelReply(
        text=message.content or "",
        tool_calls=calls,
        usage=_usage(response.usage),
        model=response.model or default_model,
        finish_reason=choice.finish_reason or "",
    )


class StreamState:
    """Accumulates ChatCompletionChunks: text, tool-call deltas by index, usage, finish reason."""

    __slots__ = ("_calls", "_text", "finish_reason", "model", "usage")

    def __init__(self, model: str) -> None:
        self._text: list[str] = []
        self._calls: dict[int, list[Any]] = {}  # index -> [id, name, [argument pieces]]
        self.usage: Any = None
        self.finish_reason = ""
        self.model = model

    def add(self, chunk: Any) -> str:
        """Take one chunk; return its text (may be "")."""
        if getattr(chunk, "usage", None) is not None:
            self.usage = chunk.usage
        if getattr(chunk, "model", None):
            self.model = chunk.model
        text = ""
        for choice in chunk.choices or ():
            if choice.index:  # we never ask for n > 1
                continue
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    text = delta.content
                    self._text.append(text)
                if delta.tool_calls:
                    for tc in delta.tool_calls:
                        self._add_call(tc)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        return text

    def _add_call(self, tc: Any) -> None:
        index = tc.index
        if index is None:  # servers without indexes: a new id starts a new call
            last = max(self._calls, default=-1)
            index = last + 1 if last < 0 or (tc.id and tc.id != self._calls[last][0]) else last
        entry = self._calls.get(index)
        if entry is None:
            entry = self._calls[index] = [None, "", []]
        if tc.id and not entry[0]:
            entry[0] = tc.id
        fn = tc.function
        if fn is not None:
            if fn.name and fn.name != entry[1]:
                entry[1] = fn.name if not entry[1] else entry[1] + fn.name
            if fn.arguments:
                entry[2].append(fn.arguments if isinstance(fn.arguments, str) else json.dumps(fn.arguments))

    def reply(self) -> ModelReply:
        seen: set[str] = set()
        calls = [make_tool_call(e[0], e[1], "".join(e[2]), seen) for _, e in sorted(self._calls.items())]
        return ModelReply(
            text="".join(self._text),
            tool_calls=calls,
            usage=_usage(self.usage),
            model=self.model,
            finish_reason=self.finish_reason,
        )
