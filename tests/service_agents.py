"""Agents for the task-service tests: scripted models (decisions from the transcript, so a recovered
run takes the same path) and tools that append to a side-effect ledger file."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from tether import Agent, Limits, tool
from tether._types import ModelReply, ModelRequest, ToolCall
from tether.models._scripted import ScriptedModel
from tether.policy import Capabilities, Capability, SafetyPolicy
from tether.tools._base import ToolContext

LEDGER = Path(os.environ.get("TETHER_TEST_LEDGER", "/tmp/tether-ledger.txt"))
RELEASE = LEDGER.with_name(LEDGER.name + ".release")  # a first try of -1 s lasts until the test makes it


def _turn(request: ModelRequest) -> int:
    return sum(1 for m in request.messages if m.role == "assistant")


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: first
        b: second
    """
    return a + b


@tool(effect="irreversible")
def charge(amount: int) -> str:
    """Charge the customer.

    Args:
        amount: in cents
    """
    with LEDGER.open("a") as fh:
        fh.write(f"charge {amount}\n")
    return f"charged {amount}"


@tool
async def wait(seconds: float) -> str:
    """Wait a while.

    Args:
        seconds: how long
    """
    await asyncio.sleep(seconds)
    return "waited"


@tool(effect="reversible")
async def book(item: str, context: ToolContext) -> str:
    """Book an item (a side effect: the ledger gets one line per idempotency key).

    Args:
        item: what to book
    """
    await asyncio.sleep(0.4)
    key = context.idempotency_key
    lines = LEDGER.read_text().splitlines() if LEDGER.exists() else []
    if not any(line.endswith(" " + key) for line in lines):
        with LEDGER.open("a") as fh:
            fh.write(f"book {item} {key}\n")
    return f"booked {item}"


@tool(effect="reversible")
def effect(seconds: float, context: ToolContext) -> str:
    """Act once per idempotency key, slowly the first time (the ledger: `start KEY` at each try,
    `done KEY` once). Sync, so it runs in a thread that a stopping process cannot cancel.

    Args:
        seconds: how long the first try takes (-1: until the test creates RELEASE)
    """
    key = context.idempotency_key
    lines = LEDGER.read_text().splitlines() if LEDGER.exists() else []
    retry = f"start {key}" in lines
    with LEDGER.open("a") as fh:
        fh.write(f"start {key}\n")
    if seconds < 0 and not retry:  # in flight for as long as the test needs, whatever the machine's load
        while not RELEASE.exists():
            time.sleep(0.05)
    else:
        time.sleep(0.2 if retry else seconds)
    if f"done {key}" not in LEDGER.read_text().splitlines():
        with LEDGER.open("a") as fh:
            fh.write(f"done {key}\n")
    return "done"


def book_script(request: ModelRequest):
    n = _turn(request)
    return ToolCall(f"b{n}", "book", {"item": f"item{n}"}) if n < 3 else "booked three"


def calc_script(request: ModelRequest):
    if _turn(request) == 0:
        return ToolCall("c1", "add", {"a": 2, "b": 3})
    return f"The sum is {request.messages[-1].content}."


def charge_script(request: ModelRequest):
    if _turn(request) == 0:
        return ToolCall("c1", "charge", {"amount": 99})
    return f"Done: {request.messages[-1].content}"


def charge_twice_script(request: ModelRequest):
    """Two charges needing approval, in two turns, with the same call id (ids are per reply)."""
    n = _turn(request)
    if n < 2:
        return ToolCall("c1", "charge", {"amount": 99 if n == 0 else 5})
    return f"Done: {request.messages[-1].content}"


def payroll_script(request: ModelRequest):
    """Three charges needing approval, announced in one turn: one question for the group."""
    if _turn(request) == 0:
        return [ToolCall(f"p{i}", "charge", {"amount": amount}) for i, amount in enumerate((10, 20, 30))]
    return "Done: " + ", ".join(m.content for m in request.messages if m.role == "tool")


def slow_script(request: ModelRequest):
    n = _turn(request)
    return ToolCall(f"w{n}", "wait", {"seconds": 0.5}) if n < 40 else "done"


def steps_script(request: ModelRequest):
    """Three `effect` calls: two in the first turn (run one at a time), one in the second. The prompt
    says how long their first tries take, in call order ("3", "120 0.2 120"; 0.2 s when not said)."""
    n = _turn(request)
    seconds = [float(s) for s in next(m.content for m in request.messages if m.role == "user").split()]

    def call(i: int) -> ToolCall:
        return ToolCall(f"e{i}", "effect", {"seconds": seconds[i] if i < len(seconds) else 0.2})

    return [call(0), call(1)] if n == 0 else call(2) if n == 1 else "finished"


ANSWER = "The sum of two and three is five, as the calculator says."


def chatty_script(request: ModelRequest):
    if _turn(request) == 0:
        return ModelReply("Let me add them.", [ToolCall("c1", "add", {"a": 2, "b": 3})])
    return ANSWER


def chatty(user: str | None) -> Agent:
    """Streams its text in 4-character pieces, 40 ms apart (as a served model does)."""
    return Agent(ScriptedModel(chatty_script, stream_chunk=4, stream_delay=0.04), tools=[add],
                 limits=Limits(max_steps=5))


def calc(user: str | None) -> Agent:
    return Agent(ScriptedModel(calc_script), tools=[add], limits=Limits(max_steps=5))


def billing(user: str | None) -> Agent:
    caps = Capabilities([Capability("charge", requires_approval=True)], unlisted="inherit")
    return Agent(ScriptedModel(charge_script), tools=[charge], policy=SafetyPolicy(capabilities=caps),
                 limits=Limits(max_steps=5))


def billing_twice(user: str | None) -> Agent:
    caps = Capabilities([Capability("charge", requires_approval=True)], unlisted="inherit")
    return Agent(ScriptedModel(charge_twice_script), tools=[charge], policy=SafetyPolicy(capabilities=caps),
                 limits=Limits(max_steps=5))


def payroll(user: str | None) -> Agent:
    caps = Capabilities([Capability("charge", requires_approval=True)], unlisted="inherit")
    return Agent(ScriptedModel(payroll_script), tools=[charge], policy=SafetyPolicy(capabilities=caps, max_approvals=1),
                 limits=Limits(max_steps=5))


def slow(user: str | None) -> Agent:
    return Agent(ScriptedModel(slow_script), tools=[wait], limits=Limits(max_steps=60, max_repeats=100))


def booking(user: str | None) -> Agent:
    return Agent(ScriptedModel(book_script), tools=[book], limits=Limits(max_steps=6))


def steps(user: str | None) -> Agent:
    return Agent(ScriptedModel(steps_script), tools=[effect], limits=Limits(max_steps=5, max_parallel_tools=1))


PAGE = ("Invoice page. <script>window.__pwned = 1; alert('pwned')</script> <img src=x onerror=\"window.__pwned=2\"> "
        "Amount due: 4200. " + "Terms and conditions apply. " * 400)


@tool(untrusted_output=True)
def read_invoice() -> str:
    """Read the customer's invoice page (web content: untrusted)."""
    return PAGE


def invoice_script(request: ModelRequest):
    """Reads the invoice (a long page with markup in it), then charges what it says (asks approval)."""
    n = _turn(request)
    if n == 0:
        return ToolCall("r1", "read_invoice", {})
    if n == 1:
        return ToolCall("c1", "charge", {"amount": 4200})
    return f"<b>Charged</b>: {request.messages[-1].content}"


def invoice(user: str | None) -> Agent:
    caps = Capabilities([Capability("charge", requires_approval=True)], unlisted="inherit")
    return Agent(ScriptedModel(invoice_script), tools=[read_invoice, charge], policy=SafetyPolicy(capabilities=caps),
                 limits=Limits(max_steps=5))


def team_script(request: ModelRequest):
    if _turn(request) == 0:
        return ToolCall("c1", "biller", {"task": "charge the customer 99"})
    return f"The biller says: {request.messages[-1].content}"


def team(user: str | None) -> Agent:
    """A parent whose sub-agent's charge needs approval: the child's call surfaces as the parent's."""
    from tether.policy import ApprovalBook, PendingApprover

    caps = Capabilities([Capability("charge", requires_approval=True)], unlisted="inherit")
    child = Agent(ScriptedModel(charge_script), tools=[charge], limits=Limits(max_steps=5),
                  policy=SafetyPolicy(capabilities=caps, approver=PendingApprover(ApprovalBook())))
    return Agent(ScriptedModel(team_script), tools=[child.as_tool("biller", "Bills customers.")],
                 limits=Limits(max_steps=5))


AGENTS = {"calc": calc, "billing": billing, "billing_twice": billing_twice, "slow": slow, "booking": booking,
          "chatty": chatty, "invoice": invoice, "team": team}
BATCH_AGENTS = {"payroll": payroll}  # tests/test_batched_approvals.py
FUZZ_AGENTS = {"calc": calc, "billing": billing}  # cheap ones, for schemathesis
SHUTDOWN_AGENTS = {"steps": steps, "billing": billing}  # tests/test_service_shutdown.py
