"""`Compaction`: a ContextBuilder that keeps what the next step needs and folds the rest.

What the model is sent each call:

    [system prompt + the task prompt]         verbatim, the same objects every call (cacheable prefix)
    [summary of the folded steps + facts]     only once something was folded
    [the turns not folded]                    verbatim: each tool call with its result
    [task state]                              the plan and established facts, when there are any

When that passes `threshold` of the model's context window (or of `Limits.max_input_tokens`), every
completed turn but the last `keep_turns` is folded: one recorded model call (through the run's step
runner; `summary_model` may name a cheaper model) extends a running summary, and a deterministic
extractor keeps the lines with names, ids, numbers, timestamps and hypotheses. A turn (an assistant
message, its tool results, and any user message after them) is folded whole, so a call is never
sent without its result or a result without its call. The summarizer reads old tool results cut to
their first lines, their telling lines and their handle. Per call the work is proportional to the
messages appended since the last call, not to the transcript.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tether._errors import InvalidInput, TetherError
from tether._tokens import (
    MessageSizes,
    TokenCounter,
    context_window,
    counter_for,
    message_tokens,
    tools_tokens,
)
from tether._types import Message, ModelRequest, ToolSpec
from tether.context._facts import FactList, message_facts, result_facts
from tether.context._task_state import TASK_TOOLS, TaskBoard, TaskState, apply_task_call, task_state_tools
from tether.models._base import Model
from tether.tools._base import Tool

if TYPE_CHECKING:
    from tether._loop import ContextRun

SUMMARY_SYSTEM = (
    "You compact an agent's working transcript. Extend the running summary with the new steps below. "
    "Keep, exactly as written: every name, id, number, path, URL, timestamp and error message that was "
    "found; every hypothesis, with whether it was confirmed or ruled out; what each tool call was for "
    "and what it returned; what is still open. Drop pleasantries and repeated text. Write terse bullet "
    "points, at most {words} words. Reply with the summary only."
)
SUMMARY_HEADER = "[Context compacted: {n} earlier steps were folded into this summary; their full text is gone.]"
_HANDLE = re.compile(r"read_result\(handle=\"[^\"]+\"")


class ContextOverflow(TetherError, RuntimeError):
    """The context cannot be brought under the run's input-token bound."""


def cut_result(text: str, lines: int = 3) -> str:
    """A tool result cut to its first lines, its telling lines, and its handle (if it was capped)."""
    rows = text.splitlines()
    if len(rows) <= lines + 1:
        return text
    head = rows[:lines]
    telling = [x for x in result_facts("\n".join(rows[lines:])) if x not in head]
    handle = _HANDLE.search(text)
    tail = [f"[{len(rows) - lines} more lines cut" + (f"; full text: {handle.group()})]" if handle else "]")]
    return "\n".join(head + telling + tail)


@dataclass
class Compaction:
    """Configuration (shared by runs); `start` gives each run its own compactor.

    `Agent(model, tools=[*my_tools, *compaction.tools()], context=compaction)`; `tools()` are the
    task-state tools (plan, facts). `window` overrides the model's context window from the table
    (`windows` adds or overrides entries).
    """

    threshold: float = 0.6
    keep_turns: int = 2
    summary_model: Model | None = None
    window: int | None = None
    windows: dict[str, int] | None = None
    summary_words: int = 400
    result_lines: int = 3
    max_facts: int = 80
    show_task_state: bool = True
    counter: TokenCounter | None = None
    board: TaskBoard = field(default_factory=TaskBoard)
    _tool_tokens: dict[tuple[int, int, str], int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 1:
            raise InvalidInput(f"threshold must be in (0, 1], got {self.threshold}")
        if self.keep_turns < 1:
            raise InvalidInput(f"keep_turns must be >= 1, got {self.keep_turns}")

    def tools(self) -> list[Tool]:
        return task_state_tools(self.board)

    def tools_tokens(self, counter: TokenCounter, specs: list[ToolSpec]) -> int:
        """The tool definitions' tokens, counted once per tool list (the same list serves every run)."""
        key = (id(specs), len(specs), counter.name)
        if key not in self._tool_tokens:
            self._tool_tokens[key] = tools_tokens(counter, specs)
        return self._tool_tokens[key]

    def start(self, run: ContextRun) -> Compactor:
        return Compactor(self, run)

    def build(self, messages: list[Message]) -> list[Message]:  # outside a run: nothing to fold with
        return messages


class Compactor:
    """One run's compaction state."""

    def __init__(self, config: Compaction, run: ContextRun) -> None:
        self.config = config
        self.run = run
        spec = run.spec
        self.run_id = spec.run_id
        self.counter = config.counter or counter_for(spec.model.name)
        # a model that knows its window says so (the embedded model's is what it was loaded with)
        window = config.window or getattr(spec.model, "context_window", None) or context_window(
            spec.model.name, config.windows)
        bound = spec.limits.max_input_tokens
        self.limit = min(window, bound) if bound else window
        self.trigger = int(self.limit * config.threshold)
        self.sizes = MessageSizes(self.counter)
        self.static_tokens = config.tools_tokens(self.counter, spec.executor.specs)
        self.state: TaskState = config.board.open(self.run_id)
        self._replayed = 0  # messages[:_replayed] have had their task-state calls applied
        self.facts = FactList(config.max_facts)
        self.summary = ""
        self.summary_message: Message | None = None
        self.summary_tokens = 0
        self.head = -1  # messages[:head]: the system prompt and the task, sent as they are
        self.prompt = -1  # index of this run's prompt when it comes after earlier turns
        self.fold = -1  # messages[head:fold] are folded into the summary
        self.turns: list[int] = []  # indices of assistant messages past the head
        self.scanned = 0
        self.folded_turns = 0
        self.compactions = 0
        self.summary_failures = 0
        self.last_input_tokens = 0

    # ----- per call -----------------------------------------------------------------------------

    def _replay_task_calls(self, messages: list[Message]) -> None:
        """Apply the task-state calls that succeeded in the messages added since the last build (each
        message once): the state follows from the transcript, so a replayed run has it too."""
        calls: dict[str, tuple[str, dict[str, Any]]] = {}
        for m in messages[self._replayed:]:
            for c in m.tool_calls:
                if c.name in TASK_TOOLS:
                    calls[c.id] = (c.name, c.arguments)
            if (m.role == "tool" and m.tool_call_id in calls and not m.content.startswith("ERROR")
                    and not self.config.board.applied(self.run_id, m.tool_call_id)):
                apply_task_call(self.state, *calls[m.tool_call_id])
        self._replayed = len(messages)

    async def build(self, messages: list[Message]) -> list[Message]:
        self._replay_task_calls(messages)
        self._sync(messages)
        state_msg = self._state_message()
        state_tokens = message_tokens(self.counter, state_msg) if state_msg is not None else 0
        if self._bound() + state_tokens <= self.trigger:  # clearly under: no need to tokenize
            return messages if state_msg is None and self.summary_message is None else self._assemble(
                messages, state_msg)
        tokens = self._tokens() + state_tokens
        if tokens > self.trigger:
            await self._compact(messages)
            tokens = self._tokens() + state_tokens
        if tokens > self.limit:
            raise ContextOverflow(
                f"the context needs {tokens} tokens, over this run's bound of {self.limit} even after compaction "
                f"(the last {self.config.keep_turns} turns are kept whole); raise Limits.max_input_tokens or "
                "cap tool results lower")
        self.last_input_tokens = tokens
        return self._assemble(messages, state_msg)

    def _assemble(self, messages: list[Message], state_msg: Message | None) -> list[Message]:
        if self.fold == self.head and state_msg is None:
            return messages  # nothing folded, no task state: the transcript as is, no copy
        out = messages[: self.head]
        if self.summary_message is not None:
            out.append(self.summary_message)
        if self.head <= self.prompt < self.fold:
            out.append(messages[self.prompt])
        out.extend(messages[self.fold:])
        if state_msg is not None:
            out.append(state_msg)
        return out

    def task_state(self) -> dict[str, Any] | None:
        state = self.config.board.close(self.run_id) or self.state
        return None if state.empty else state.to_dict()

    # ----- helpers ------------------------------------------------------------------------------

    def _sync(self, messages: list[Message]) -> None:
        if len(messages) < self.scanned:  # a different transcript: start over
            self.__init__(self.config, self.run)  # type: ignore[misc]
        if self.head < 0:
            head = 0
            while head < len(messages) and messages[head].role == "system":
                head += 1
            if head < len(messages) and messages[head].role == "user":
                head += 1
            self.head = self.fold = head
            self.scanned = head
            # a continued conversation: this run's own prompt (the last user message it started with)
            # stays verbatim even when the turns around it are folded
            last = len(messages) - 1
            self.prompt = last if last >= head and messages[last].role == "user" else -1
        self.sizes.sync(messages)
        for i in range(self.scanned, len(messages)):
            if messages[i].role == "assistant":
                self.turns.append(i)
        self.scanned = len(messages)

    def _bound(self) -> int:
        pinned = self.sizes.bound(self.prompt, self.prompt + 1) if self.head <= self.prompt < self.fold else 0
        return (self.static_tokens + self.sizes.bound(0, self.head) + self.summary_tokens + pinned
                + self.sizes.bound(self.fold))

    def _tokens(self) -> int:
        pinned = self.sizes.size(self.prompt) if self.head <= self.prompt < self.fold else 0
        return (self.static_tokens + self.sizes.total(0, self.head) + self.summary_tokens + pinned
                + self.sizes.total(self.fold))

    def _state_message(self) -> Message | None:
        if not self.config.show_task_state or self.state.empty:
            return None
        return Message.user(self.state.render())

    async def _compact(self, messages: list[Message]) -> None:
        first = bisect.bisect_left(self.turns, self.fold)  # turns are indices in order: O(log n)
        open_count = len(self.turns) - first
        if open_count <= self.config.keep_turns:
            return
        new_fold = self.turns[-self.config.keep_turns]
        span = messages[self.fold:new_fold]
        for m in span:
            self.facts.extend(message_facts(m))
        self.summary = await self._summarize(span)
        self.folded_turns += open_count - self.config.keep_turns
        self.compactions += 1
        self.fold = new_fold
        text = SUMMARY_HEADER.format(n=self.folded_turns) + "\n" + self.summary
        if len(self.facts):
            text += "\n\nFacts kept verbatim from the folded steps:\n" + self.facts.render()
        self.summary_message = Message.user(text)
        self.summary_tokens = message_tokens(self.counter, self.summary_message)

    async def _summarize(self, span: list[Message]) -> str:
        steps = "\n".join(self._render(m) for m in span)
        prompt = (f"Running summary so far:\n{self.summary or '(none yet)'}\n\nNew steps to fold in:\n{steps}")
        system = SUMMARY_SYSTEM.format(words=self.config.summary_words)
        request = ModelRequest([Message.system(system), Message.user(prompt)], [],
                               max_output_tokens=self.config.summary_words * 2)
        try:
            reply = await self.run.complete(request, self.config.summary_model, purpose="compaction")
            text = reply.text.strip()
        except Exception:  # a failed summary must not end the run: the extractor's facts still stand
            self.summary_failures += 1
            text = ""
        if not text:  # what was done, at most the summary's length (the oldest lines go first)
            calls = [f"- {c.name}({json.dumps(c.arguments, ensure_ascii=False, default=str)[:160]})"
                     for m in span for c in m.tool_calls]
            lines = [*filter(None, self.summary.splitlines()), *calls]
            words, keep = 0, list[str]()
            for line in reversed(lines):
                words += len(line.split())
                if words > self.config.summary_words and keep:
                    break
                keep.append(line)
            text = "\n".join(reversed(keep))
        return text

    def _render(self, m: Message) -> str:
        if m.role == "tool":
            return f"[result of {m.name}]\n{cut_result(m.content, self.config.result_lines)}"
        if m.role == "assistant":
            calls = "; ".join(f"{c.name}({json.dumps(c.arguments, ensure_ascii=False, default=str)})"
                              for c in m.tool_calls)
            return f"[assistant] {m.content}" + (f"\n[calls] {calls}" if calls else "")
        return f"[{m.role}] {m.content}"
