"""Anthropic's Messages API with native tool use (the `anthropic` SDK, an optional extra).

Mapping from tether messages: system messages are joined into `system=`; an assistant's tool
calls become `tool_use` blocks; tool results become `tool_result` blocks in a user message, and
consecutive results (and the user text after them) share one user message, results first, as the
API requires. Empty messages are dropped (the API rejects empty text blocks).

Prompt caching: with `cache_prompt` (the default) the static prefix gets cache breakpoints, one on
the system block and one on the last tool definition, so a context builder that keeps that prefix
byte-identical across calls (tether.context) pays the cache-read price for it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

from tether._errors import InvalidInput, MissingDependency
from tether._output import final_tool
from tether._types import Message, ModelReply, ModelRequest, TextDelta, ToolCall, ToolSpec, Usage
from tether.models._loop_client import LoopClient
from tether.models._openai_compat import NO_KEY, make_tool_call, same_url, tool_choice_name
from tether.models._retry import (
    DEFAULT_DEADLINE,
    DEFAULT_IDLE_TIMEOUT,
    Failure,
    RetryPolicy,
    call_with_retries,
    classify_sdk_error,
    stream_with_retries,
)

ANTHROPIC_URL = "https://api.anthropic.com"


def _sdk() -> Any:
    try:
        import anthropic
    except ImportError:
        raise MissingDependency("AnthropicModel needs the anthropic SDK: pip install 'tether[anthropic]'") from None
    return anthropic


class AnthropicModel:
    """A `Model` over Anthropic's Messages API; retries, deadline and idle timeout like
    `OpenAICompatModel` (`idle_timeout`, 60 s: the longest wait for a whole reply, or for each
    complete stream event; pings do not count).

    `max_tokens` is the default output cap (the API requires one); a request's
    `max_output_tokens` overrides it. The key comes from `api_key`, else ANTHROPIC_API_KEY, which
    is sent only to the URL it was configured for (ANTHROPIC_BASE_URL, else api.anthropic.com):
    another `base_url` gets no key unless `api_key` is given.
    Structured output is a final tool the model is forced to use (`tool_choice`).
    """

    native_output = True  # renders ModelRequest.output_schema (tether._output)

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = 4096,
        max_retries: int = 3,
        timeout: float = 60.0,
        temperature: float | None = None,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        deadline: float | None = DEFAULT_DEADLINE,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        env: Mapping[str, str] | None = None,
        cache_prompt: bool = True,
    ) -> None:
        self._anthropic = _sdk()
        if not model:
            raise InvalidInput("model name is required, e.g. AnthropicModel('claude-haiku-4-5')")
        if max_tokens < 1:
            raise InvalidInput(f"max_tokens must be >= 1, got {max_tokens}")
        self.model = model
        self.name = model
        env = os.environ if env is None else env
        configured = env.get("ANTHROPIC_BASE_URL") or ANTHROPIC_URL
        self.base_url = (base_url or configured).rstrip("/")
        key = api_key or (env.get("ANTHROPIC_API_KEY") if same_url(self.base_url, configured) else None)
        if not key:
            if same_url(self.base_url, ANTHROPIC_URL):
                raise InvalidInput("no API key for api.anthropic.com: set ANTHROPIC_API_KEY or pass --api-key / api_key=")
            key = NO_KEY
        # Always explicit, so the SDK never picks a key from the environment for another URL.
        self.api_key = key
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.temperature = temperature
        self.cache_prompt = cache_prompt
        self.policy = RetryPolicy(max_retries=max_retries, backoff_base=backoff_base, backoff_max=backoff_max,
                                  deadline=deadline, idle_timeout=idle_timeout)
        self._sleep = asyncio.sleep
        self._clients = LoopClient(lambda: self._anthropic.AsyncAnthropic(
            api_key=self.api_key, base_url=self.base_url, timeout=self.timeout, max_retries=0))
        self._prefix = f"model {model!r} at {self.base_url}"

    def __repr__(self) -> str:
        return f"AnthropicModel({self.model!r})"

    async def aclose(self) -> None:
        """Close the HTTP client this event loop opened (a synchronous `Agent.run` calls it before
        its loop ends)."""
        await self._clients.aclose()

    def _get_client(self) -> Any:
        return self._clients.get()

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        system, messages = to_anthropic_messages(request.messages)
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_output_tokens or self.max_tokens,
            "messages": messages,
        }
        if system:
            params["system"] = system
        if request.tools:
            params["tools"] = to_anthropic_tools(request.tools)
            choice = anthropic_tool_choice(tool_choice_name(request))
            if choice is not None:
                params["tool_choice"] = choice
        if self.cache_prompt:
            add_cache_breakpoints(params)
        temperature = request.temperature if request.temperature is not None else self.temperature
        if temperature is not None:
            # Recent SDKs dropped `temperature` from create()'s signature; the API still takes it.
            params["extra_body"] = {"temperature": temperature}
        if request.stop:
            params["stop_sequences"] = list(request.stop)
        if request.output_schema is not None:
            force_output_tool(params, request)
        return params

    def _classify(self, exc: Exception) -> Failure | None:
        return classify_anthropic_error(self._anthropic, exc, self.timeout)

    async def complete(self, request: ModelRequest) -> ModelReply:
        params = self._params(request)
        client = self._get_client()

        async def once() -> Any:
            return await client.messages.create(**params)

        response = await call_with_retries(once, self.policy, self._classify, self._prefix, self._sleep)
        return reply_from_message(response, self.model)

    async def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | ModelReply]:
        """Stream text deltas, then one ModelReply; retried only before the first delta."""
        params = self._params(request)
        params["stream"] = True
        client = self._get_client()
        async for item in stream_with_retries(
            lambda: client.messages.create(**params), lambda: AnthropicStreamState(self.model), self.policy, self._classify, self._prefix, self._sleep
        ):
            yield item


def classify_anthropic_error(sdk: Any, exc: Exception, timeout: float | None = None) -> Failure | None:
    """Sort an anthropic SDK exception into retryable or not (429, 408, 5xx and 529 retry)."""
    return classify_sdk_error(sdk, sdk.AnthropicError, exc, timeout)


# ----- tether -> Anthropic -------------------------------------------------------------------------


def to_anthropic_messages(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """(system text, messages) for the Messages API; see the module docstring for the mapping."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.role
        if role == "system":
            if m.content:
                system.append(m.content)
        elif role == "user":
            if m.content.strip():  # the API refuses whitespace-only text blocks
                _append(out, "user", {"type": "text", "text": m.content})
        elif role == "tool":
            if not m.tool_call_id:
                raise InvalidInput(
                    f"tool message without tool_call_id (name={m.name!r}); every tool result needs its call id"
                )
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.tool_call_id}
            if m.content:
                block["content"] = m.content
            _append(out, "user", block)
        elif role == "assistant":
            if m.content.strip():
                _append(out, "assistant", {"type": "text", "text": m.content})
            for call in m.tool_calls:
                _append(out, "assistant", _tool_use(call))
        else:
            raise InvalidInput(f"unknown message role {role!r}; expected system, user, assistant or tool")
    return "\n\n".join(system), out


def _append(out: list[dict[str, Any]], role: str, block: dict[str, Any]) -> None:
    if out and out[-1]["role"] == role:
        content = out[-1]["content"]
        if block["type"] == "tool_result":
            # tool_result blocks must open a user message, before any text
            at = 0
            while at < len(content) and content[at]["type"] == "tool_result":
                at += 1
            content.insert(at, block)
        else:
            content.append(block)
    else:
        out.append({"role": role, "content": [block]})


def _tool_use(call: ToolCall) -> dict[str, Any]:
    # The API requires `input` to be an object; a call whose arguments did not parse goes back as {}.
    return {
        "type": "tool_use",
        "id": call.id,
        "name": call.name,
        "input": {} if call.parse_error else call.arguments,
    }


def anthropic_tool_choice(choice: str | None) -> dict[str, Any] | None:
    """tether's tool choice in the Messages API's shape ("required" is Anthropic's "any")."""
    if choice is None:
        return None
    if choice in ("auto", "none"):
        return {"type": choice}
    if choice == "required":
        return {"type": "any"}
    return {"type": "tool", "name": choice}


def force_output_tool(params: dict[str, Any], request: ModelRequest) -> None:
    """Structured output: a final tool whose input is the answer, and a turn that must use a tool
    (that one alone when there are no other tools, or they may not be called: tool_choice "none")."""
    assert request.output_schema is not None
    final = final_tool(request.output_schema)
    params["tools"] = [*params.get("tools", ()), *to_anthropic_tools([final])]
    others = bool(request.tools) and request.tool_choice != "none"
    params["tool_choice"] = {"type": "any"} if others else {"type": "tool", "name": final.name}


def to_anthropic_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools]


def add_cache_breakpoints(params: dict[str, Any]) -> None:
    """Mark the end of the system prompt and of the tool definitions as cache breakpoints."""
    if isinstance(params.get("system"), str):
        params["system"] = [{"type": "text", "text": params["system"], "cache_control": {"type": "ephemeral"}}]
    if params.get("tools"):
        params["tools"][-1] = {**params["tools"][-1], "cache_control": {"type": "ephemeral"}}


# ----- Anthropic -> tether -------------------------------------------------------------------------


def _usage(u: Any) -> Usage:
    if u is None:
        return Usage()
    # Cached prompt tokens are still prompt tokens for budgets; pricing prices them apart.
    read = getattr(u, "cache_read_input_tokens", 0) or 0
    write = getattr(u, "cache_creation_input_tokens", 0) or 0
    inp = (getattr(u, "input_tokens", 0) or 0) + write + read
    return Usage(input_tokens=inp, output_tokens=getattr(u, "output_tokens", 0) or 0,
                 cached_input_tokens=read, cache_write_tokens=write)


def reply_from_message(response: Any, default_model: str) -> ModelReply:
    """An anthropic `Message` (SDK object) -> ModelReply."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    seen: set[str] = set()
    for block in response.content or ():
        kind = block.type
        if kind == "text":
            texts.append(block.text)
        elif kind == "tool_use":
            calls.append(make_tool_call(block.id, block.name, block.input, seen))
    return ModelReply(
        text="".join(texts),
        tool_calls=calls,
        usage=_usage(response.usage),
        model=response.model or default_model,
        finish_reason=response.stop_reason or "",
    )


class AnthropicStreamState:
    """Accumulates raw stream events: text, tool_use blocks with their JSON pieces, usage."""

    __slots__ = ("_blocks", "_text", "cached", "finish_reason", "input_tokens", "model", "output_tokens")

    def __init__(self, model: str) -> None:
        self._text: list[str] = []
        self._blocks: dict[int, list[Any]] = {}  # index -> [id, name, [partial json]]
        self.input_tokens = 0
        self.output_tokens = 0
        self.cached = (0, 0)
        self.finish_reason = ""
        self.model = model

    def add(self, event: Any) -> str:
        kind = event.type
        if kind == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta":
                text: str = delta.text
                self._text.append(text)
                return text
            if delta.type == "input_json_delta" and event.index in self._blocks:
                self._blocks[event.index][2].append(delta.partial_json)
        elif kind == "content_block_start":
            block = event.content_block
            if block.type == "tool_use":
                start = [block.input] if block.input else []  # usually {} with the JSON in deltas
                self._blocks[event.index] = [block.id, block.name, start]
            elif block.type == "text" and block.text:
                first: str = block.text
                self._text.append(first)
                return first
        elif kind == "message_start":
            message = event.message
            self.model = message.model or self.model
            opening = _usage(message.usage)
            self.input_tokens = opening.input_tokens
            self.cached = (opening.cached_input_tokens, opening.cache_write_tokens)
            self.output_tokens = getattr(message.usage, "output_tokens", 0) or 0
        elif kind == "message_delta":
            if event.delta.stop_reason:
                self.finish_reason = event.delta.stop_reason
            if event.usage is not None and event.usage.output_tokens:
                self.output_tokens = event.usage.output_tokens  # cumulative, not a delta
        return ""

    def reply(self) -> ModelReply:
        seen: set[str] = set()
        calls = []
        for _, (call_id, name, pieces) in sorted(self._blocks.items()):
            raw: Any = (
                pieces[0]
                if len(pieces) == 1 and isinstance(pieces[0], dict)
                else "".join(p for p in pieces if isinstance(p, str))
            )
            calls.append(make_tool_call(call_id, name, raw, seen))
        return ModelReply(
            text="".join(self._text),
            tool_calls=calls,
            usage=Usage(input_tokens=self.input_tokens, output_tokens=self.output_tokens,
                        cached_input_tokens=self.cached[0], cache_write_tokens=self.cached[1]),
            model=self.model,
            finish_reason=self.finish_reason,
        )
