"""A critic: a fresh-context review of a run's final answer against the tool outputs, which can
send the answer back once with reasons.

Two checks, cheapest first:
- claims supported (deterministic, free): every number, time, version and id the answer states must
  appear in what the tools returned or the user wrote ("1,465 ms" is found as 1465);
- optionally a reviewer model, given only the task, the tool outputs and the answer (a fresh context,
  not the run's transcript), replying OK or REVISE with reasons. Its tokens and cost count in the run.

    result = await run_with_critic(agent, "Why is checkout slow?", Critic(model=cheap_model))
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tether._limits import Limits
from tether._tokens import counter_for, message_tokens
from tether._types import Message, ModelRequest, RunResult, Usage
from tether.events import CriticReviewed
from tether.models._base import Model
from tether.models._pricing import Pricing, charge, model_rates, require_prices

if TYPE_CHECKING:
    from tether._agent import Agent

_CLAIM = re.compile(
    r"\b[A-Z][A-Z0-9]*-\d+\b"          # ids: INC-4000
    r"|\bv\d+(?:\.\d+)+\b"              # versions: v2.14.0
    r"|\b\d{1,2}:\d{2}(?::\d{2})?\b"    # times: 10:12:51
    r"|(?<![\w.])\d[\d,]*(?:\.\d+)?"    # numbers: 1,465  0.0253  41
)
_CITATION = re.compile(r"\[\d+\]")

REVIEW_PROMPT = (
    "You review an assistant's final answer. Use only the task and the tool outputs below; do not assume "
    "anything else is true.\n\nTask:\n{task}\n\nTool outputs:\n{evidence}\n\nAnswer:\n{answer}\n\n"
    "Is every claim in the answer supported by the tool outputs, and does it answer the task? Reply with OK, "
    "or with REVISE followed by the unsupported or missing points, one per line."
)
REVISE_PROMPT = ("A reviewer checked your answer against the tool outputs and found problems:\n{reasons}\n"
                 "Check the tool outputs again (use tools if needed) and give a corrected final answer.")


@dataclass(slots=True)
class Review:
    ok: bool
    reasons: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)


def _norm(text: str) -> str:
    return text.replace(",", "")


def _claims(text: str) -> list[str]:
    return [c for c in (m.group().rstrip(".,") for m in _CLAIM.finditer(text)) if c]


def unsupported_claims(answer: str, evidence: str) -> list[str]:
    """The concrete claims (numbers, times, versions, ids) in `answer` that `evidence` does not state.
    Matching is whole-token ("12" is not found inside "v2.12"), thousands separators aside; a time
    "10:10" is supported by "10:10:12"."""
    known = {_norm(c) for c in _claims(evidence)}
    times = [c for c in known if ":" in c]
    out: list[str] = []
    for claim in _claims(answer):
        key = _norm(claim)
        if key in known or claim in out or (":" in key and any(t.startswith(key + ":") for t in times)):
            continue
        out.append(claim)
    return out


class Critic:
    """Reviews a final answer; `model=None` runs only the deterministic support check."""

    def __init__(self, model: Model | None = None, *, check_claims: bool = True, require_citations: bool = False,
                 max_evidence_chars: int = 12_000, max_output_tokens: int = 300) -> None:
        self.model = model
        self.check_claims = check_claims
        self.require_citations = require_citations
        self.max_evidence_chars = max_evidence_chars
        self.max_output_tokens = max_output_tokens

    async def review(self, task: str, answer: str, tool_outputs: list[str], *, pricing: Pricing | None = None,
                     limits: Limits | None = None, used: Usage | None = None) -> Review:
        """The deterministic checks, then the reviewer model's verdict, priced with `pricing`. With
        `limits` and the run's `used` usage, the reviewer call is made only if it fits what is left
        of the token and cost ceilings (its input counted, its output capped), else it is skipped."""
        evidence = "\n".join(tool_outputs)
        reasons: list[str] = []
        if self.check_claims:
            reasons += [f"'{c}' appears in no tool output" for c in unsupported_claims(answer, evidence + "\n" + task)]
        if self.require_citations and not _CITATION.search(answer):
            reasons.append("the answer cites no passage ([1], [2], ...)")
        usage = Usage()
        if self.model is not None:
            shown = evidence if len(evidence) <= self.max_evidence_chars else evidence[: self.max_evidence_chars] + "\n[...]"
            request = ModelRequest([Message.user(REVIEW_PROMPT.format(task=task, evidence=shown or "(none)",
                                                                      answer=answer))], [],
                                   max_output_tokens=self.max_output_tokens, temperature=0.0)
            prices = pricing or Pricing()
            if limits is not None and limits.max_cost_usd is not None:
                require_prices(self.model, prices)  # a reviewer with no price cannot be bounded: refused
            if limits is not None and not _fits(request, self.model, prices, limits, used or Usage()):
                return Review(not reasons, [*reasons], usage)  # no room left in the run's budget: no reviewer
            reply = await self.model.complete(request)
            cost = charge(prices, self.model, reply)
            usage = Usage(reply.usage.input_tokens, reply.usage.output_tokens, cost, 1)
            text = reply.text.strip()
            if not text.upper().startswith("OK"):
                lines = [ln.strip(" -*") for ln in text.splitlines()[1:] if ln.strip(" -*")]
                head = text.split("\n", 1)[0].removeprefix("REVISE").strip(" :")
                reasons += [r for r in [head, *lines] if r] or ["the reviewer asked for a revision"]
        return Review(not reasons, reasons, usage)


def _fits(request: ModelRequest, model: Model, pricing: Pricing, limits: Limits, used: Usage) -> bool:
    """Whether the reviewer call, at its most (input as counted, output at its cap), stays within the
    run's token and cost limits."""
    counter = counter_for(model.name)
    n_in = sum(message_tokens(counter, m) for m in request.messages) + 3
    n_out = request.max_output_tokens or 0
    if limits.max_tokens is not None and used.total_tokens + n_in + n_out > limits.max_tokens:
        return False
    if limits.max_cost_usd is None:
        return True
    rates = model_rates(model, pricing)
    assert rates is not None  # review() refused an unpriced reviewer under a cost ceiling
    return used.cost_usd + (n_in * rates[0] + n_out * rates[1]) / 1_000_000 <= limits.max_cost_usd


async def run_with_critic(agent: Agent[Any], prompt: str, critic: Critic, *, max_revisions: int = 1,
                          **kwargs: Any) -> RunResult[Any]:
    """Run, review the answer, and send it back with the reasons up to `max_revisions` times. The revision
    continues the run's own state (its budget, taint and loop counts), with the review's usage added. Under a
    cost ceiling a reviewer model with no price is refused before the run starts (`UnpricedModel`)."""
    if critic.model is not None and agent.limits.max_cost_usd is not None:
        require_prices(critic.model, agent.pricing)
    result = await agent.arun(prompt, **kwargs)
    for _ in range(max_revisions):
        if not result.completed:
            return result
        outputs = [m.content for m in result.messages if m.role == "tool"]
        review = await critic.review(prompt, result.answer, outputs, pricing=agent.pricing, limits=agent.limits,
                                     used=result.usage)
        result.trace.append(CriticReviewed(step=result.steps, t=result.trace[-1].t if result.trace else 0.0,
                                           ok=review.ok, reasons=review.reasons,
                                           input_tokens=review.usage.input_tokens).envelope())
        if review.ok:
            result.usage.add(review.usage)
            return result
        state = result.state
        if state is None:  # a run without a carried state cannot be continued in its own budget
            result.usage.add(review.usage)
            return result
        state.usage.add(review.usage)  # the review counts against the run's budget
        trace = result.trace
        result = await agent.arun(REVISE_PROMPT.format(reasons="\n".join(f"- {r}" for r in review.reasons)),
                                  state=state, run_id=result.run_id)
        result.trace = trace + result.trace
    return result
