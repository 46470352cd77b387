"""A research team over a local document collection: a planner splits the question, researchers
(each with the retrieval search tool) answer one sub-question each, a writer synthesises with
citations. Also the single-agent baseline it is measured against (bench/multiagent).

Without a model spec every role is a small deterministic stand-in ("extractive": search, then quote
the passage sentence that best matches the question), so the example and the benchmark run offline;
with `model` (e.g. "openai:gpt-4o-mini") every role is that model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tether import Agent, Limits, ModelReply, ModelRequest, ScriptedModel, Usage, call
from tether.context import counter_for, message_tokens, tools_tokens
from tether.models import Model, resolve_model
from tether.rag import Index, search_tool
from tether.team import TeamResult, orchestrate

DOCS = Path(__file__).with_name("docs")
QUESTIONS = Path(__file__).with_name("questions.json")
RESEARCHER = "Answer the question from the documents: search, then answer in one sentence."
_STOP = {"the", "a", "an", "of", "is", "what", "which", "how", "and", "does", "do", "per", "for", "in", "its",
         "to", "are", "with", "when", "who", "many", "much", "at", "most"}


def build_index(directory: str | Path) -> Index:
    index = Index(directory, retriever="bm25")
    index.ingest(DOCS)
    return index


class Counted:
    """Reports the tokens a provider would count (OpenAI's tokenizer) for a stand-in model, so the
    token and cost columns of the two set-ups compare what each sends and writes."""

    def __init__(self, inner: Model, name: str = "gpt-4o-mini") -> None:
        self.inner, self.name, self.counter = inner, name, counter_for(name)

    async def complete(self, request: ModelRequest) -> ModelReply:
        reply = await self.inner.complete(request)
        n_in = sum(message_tokens(self.counter, m) for m in request.messages) + 3
        n_in += tools_tokens(self.counter, list(request.tools))
        n_out = self.counter.count(reply.text) + sum(
            self.counter.count(json.dumps(c.arguments)) + 3 for c in reply.tool_calls)
        reply.usage = Usage(n_in, n_out)
        reply.model = self.name
        return reply

    async def stream(self, request: ModelRequest):  # pragma: no cover - not streamed here
        yield await self.complete(request)


def _words(text: str) -> set[str]:
    """Content words, cut to 5 letters (a crude stem: launch/launched, cost/costs)."""
    return {w[:5] for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP}


def _task(request: ModelRequest) -> str:
    return next(m.content for m in request.messages if m.role == "user")


def extractive(request: ModelRequest) -> Any:
    """Search with the question, then answer with the best-matching sentence of what came back."""
    results = [m.content for m in request.messages if m.role == "tool"]
    question = _task(request)
    if not results and request.tools:
        return call("search", query=question)
    sentences = [s.strip() for r in results for s in re.split(r"(?<=[.!?])\s+|\n", r) if s.strip()
                 and not s.startswith(("[", "section:", "("))]
    want = _words(question)
    best = max(sentences, key=lambda s: len(want & _words(s)), default="")
    return best or "I found nothing on this."


def planner_stand_in(request: ModelRequest) -> str:
    """Splits 'X and Y' / 'X, Y' questions into their parts, each restated with the question's subject."""
    q = _task(request).split("Question: ", 1)[-1].rstrip("?").strip()
    parts = [p.strip() for p in re.split(r",\s*|\s+and\s+", q) if p.strip()]
    return json.dumps({"questions": [p if p.endswith("?") else p + "?" for p in parts][:4] or [q + "?"]})


def writer_stand_in(request: ModelRequest) -> str:
    """Joins the researchers' findings, each cited; names failed researchers."""
    blocks = re.findall(r"\[(W\d+)\] [^\n]*\n([^\n]*)", _task(request))
    lines = [f"{text} [{wid}]" if not text.startswith("FAILED") else f"{wid} failed: nothing on that part."
             for wid, text in blocks]
    return "\n".join(lines) or "No findings."


def team(model: str | None = None, *, index: Index) -> tuple[Agent, Agent, Agent]:
    search = search_tool(index, default_k=3)
    if model:
        m = resolve_model(model)
        return (Agent(m), Agent(m, tools=[search], instructions=RESEARCHER, limits=Limits(max_steps=4)),
                Agent(m))
    return (Agent(Counted(ScriptedModel(planner_stand_in))),
            Agent(Counted(ScriptedModel(extractive)), tools=[search], instructions=RESEARCHER,
                  limits=Limits(max_steps=4)),
            Agent(Counted(ScriptedModel(writer_stand_in))))


def single_agent(model: str | None = None, *, index: Index) -> Agent:
    search = search_tool(index, default_k=3)
    m = resolve_model(model) if model else Counted(ScriptedModel(extractive))
    return Agent(m, tools=[search], instructions=RESEARCHER, limits=Limits(max_steps=8))


async def ask_team(question: str, model: str | None = None, *, index: Index,
                   limits: Limits | None = None) -> TeamResult:
    planner, researcher, writer = team(model, index=index)
    return await orchestrate(question, planner=planner, worker=researcher, synthesizer=writer,
                             limits=limits or Limits(max_tokens=40_000), max_workers=4)


def questions() -> list[dict[str, Any]]:
    return json.loads(QUESTIONS.read_text("utf-8"))
