"""Answering questions from an index: pipeline mode (retrieve, then one tool-free model call)
and agentic mode (the model calls the search tool itself)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from tether._limits import Limits
from tether._types import ModelReply, ModelRequest, RunResult
from tether.context import ContextOverflow
from tether.models._base import Model
from tether.rag._base import Hit
from tether.rag._prompt import AGENT_INSTRUCTIONS, build_messages
from tether.rag._tool import Searchable, search_tool


@dataclass
class PipelineAnswer:
    answer: str
    hits: list[Hit] = field(default_factory=list)
    reply: ModelReply | None = None


async def apipeline(question: str, index: Searchable, model: Model, *, k: int = 5,
                    max_output_tokens: int | None = 512) -> PipelineAnswer:
    """Retrieve the top `k` passages, then ask the model once, without tools. With a model that
    knows its context window, the last passages are left out until the prompt and the reply fit;
    ContextOverflow when even one does not."""
    hits = index.search(question, k)
    messages = build_messages(question, hits)
    window = getattr(model, "context_window", None)
    if window:
        from tether._tokens import counter_for, message_tokens

        counter = counter_for(model.name)
        room = window - (max_output_tokens or 512)

        def needed() -> int:
            return sum(message_tokens(counter, m) for m in messages)

        while len(hits) > 1 and needed() > room * 0.9:
            hits = hits[:-1]  # the estimate may be off by a little: keep a tenth in reserve
            messages = build_messages(question, hits)
        if needed() > room:  # even the question and one passage: the model would refuse the request
            raise ContextOverflow(f"the question and {'one passage' if hits else 'its prompt'} need about "
                                  f"{needed()} tokens, over the {room} that {model.name}'s context window of {window} "
                                  f"leaves beside the reply; ask a shorter question")
    request = ModelRequest(messages, max_output_tokens=max_output_tokens, temperature=0.0)
    reply = await model.complete(request)
    return PipelineAnswer(reply.text.strip(), hits, reply)


def pipeline(question: str, index: Searchable, model: Model, *, k: int = 5) -> PipelineAnswer:
    """Synchronous `apipeline`."""
    return asyncio.run(apipeline(question, index, model, k=k))


def agentic(question: str, index: Searchable, model: Model, *, k: int = 5, limits: Limits | None = None) -> RunResult[Any]:
    """Run an Agent whose one tool is `search` over `index`. Earlier searches are folded into a
    summary when the transcript nears the model's context window (a small embedded model's 4,096
    tokens hold about three searches)."""
    from tether._agent import Agent
    from tether.context import Compaction

    agent = Agent(model, tools=[search_tool(index, default_k=k)], instructions=AGENT_INSTRUCTIONS,
                  limits=limits or Limits(max_steps=6), context=Compaction(keep_turns=1))
    return agent.run(question)
