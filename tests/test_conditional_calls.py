"""call_if (tether.values._conditional): a call the model writes before the reader decides whether it runs;
the model is never told the answer, so its context stays trusted and the call asks nobody."""

from __future__ import annotations

import json
from typing import Any

from test_hidden_values import INJECTED, USER_ADDRESS, World, handle_in

from tether._agent import Agent
from tether._limits import Limits
from tether.models._scripted import ScriptedModel, call
from tether.policy import ApprovalRequest, CallbackApprover, SafetyPolicy
from tether.tools._base import Tool, tool
from tether.values._conditional import RECORD_CHARS


def _tools(world: World, booked: list[dict[str, Any]]) -> list[Tool]:
    @tool(effect="irreversible")
    def book(hotel: str, nights: int) -> str:
        """Book a hotel."""
        booked.append({"hotel": hotel, "nights": nights})
        return f"booked {hotel}"

    @tool(effect="irreversible", metadata={"conditional": False})
    def wire(iban: str, amount: float) -> str:
        """Send money."""
        return "sent"

    return [*world.tools(), book, wire]


def _run(reply: str, inner: dict[str, Any], *, when: str = "true", approve: bool = True, extra: dict[str, Any] | None = None
         ) -> tuple[ScriptedModel, Any, list[ApprovalRequest], list[dict[str, Any]], World]:
    world, booked, asked = World(), [], []  # type: ignore[var-annotated]

    def step(request: Any) -> Any:
        tools = [m for m in request.messages if m.role == "tool"]
        if not tools:
            return call("read_email", id=1)
        if len(tools) == 1:
            args = {"handle": handle_in(tools[0].content), "question": "Is it rated over 4?",
                    "answer_type": "boolean", "when": when, **inner, **(extra or {})}
            return call("call_if", **args)
        if len(tools) == 2:
            return call("send_email", to=USER_ADDRESS, body="I looked at it.")
        return "done"

    def decide(req: ApprovalRequest) -> bool:
        asked.append(req)
        return approve

    model = ScriptedModel(step)
    policy = SafetyPolicy(approver=CallbackApprover(decide), query_model=ScriptedModel([reply]))
    res = Agent(model, tools=_tools(world, booked), policy=policy, limits=Limits(max_steps=6)).run("book it if good")
    return model, res, asked, booked, world


BOOK = {"tool": "book", "arguments": {"hotel": "Le Petit", "nights": 2}}


def _shown(model: ScriptedModel) -> list[str]:
    return [m.content for m in model.requests[-1].messages if m.role in ("tool", "user")]


def test_the_call_runs_when_the_answer_matches_asks_nobody_and_the_run_stays_clean() -> None:
    _, res, asked, booked, world = _run("true", BOOK)
    assert booked == [{"hotel": "Le Petit", "nights": 2}]
    assert asked == [] and not res.tainted
    assert world.sent == [{"to": USER_ADDRESS, "body": "I looked at it."}]  # a later effect asks nobody either


def test_the_model_cannot_tell_whether_the_call_ran() -> None:
    ran, _, _, booked, _ = _run("true", BOOK)
    not_run, _, _, not_booked, _ = _run("false", BOOK)
    assert booked and not not_booked
    # the same line: a handle whose description (size, shape) does not depend on the outcome
    line_ran, line_not = _shown(ran)[2], _shown(not_run)[2]
    assert line_ran == line_not and f"{RECORD_CHARS:,} characters" in line_ran
    assert "true" not in line_ran.split(":", 1)[1].split("call_if(")[0]
    assert all("booked" not in t for t in _shown(ran))


def test_a_reply_outside_the_type_runs_nothing_and_says_nothing() -> None:
    model, _, asked, booked, _ = _run(INJECTED, BOOK)
    line_ok = _shown(_run("false", BOOK)[0])[2]
    assert booked == [] and asked == []
    assert _shown(model)[2] == line_ok


def test_a_handle_in_the_inner_arguments_is_labelled_when_the_call_runs_and_asks() -> None:
    world, booked = World(), []  # type: ignore[var-annotated]
    asked: list[ApprovalRequest] = []

    def step(request: Any) -> Any:
        tools = [m for m in request.messages if m.role == "tool"]
        if not tools:
            return call("read_email", id=1)
        if len(tools) == 1:
            h = handle_in(tools[0].content)
            return call("call_if", handle=h, question="Is it rated over 4?", answer_type="boolean", when="true",
                        tool="book", arguments={"hotel": h, "nights": 2})
        return "done"

    def decide(req: ApprovalRequest) -> bool:
        asked.append(req)
        return False

    policy = SafetyPolicy(approver=CallbackApprover(decide), query_model=ScriptedModel(["true"]))
    Agent(ScriptedModel(step), tools=_tools(world, booked), policy=policy, limits=Limits(max_steps=5)).run("go")
    assert len(asked) == 1 and "hidden values" in asked[0].reason  # the attacker's text as the hotel: asked
    assert booked == []


def test_refusals_come_before_anything_is_read() -> None:
    for inner, extra, want in [
        ({"tool": "wire", "arguments": {"iban": "X", "amount": 1}}, {}, "never to run on a condition"),
        ({"tool": "inspect_value", "arguments": {}}, {}, "runs one call of another tool"),
        ({"tool": "nope", "arguments": {}}, {}, "unknown tool"),
        (BOOK, {"when": "maybe"}, "when must be true or false"),
    ]:
        when = extra.pop("when", "true")
        model, _, _, booked, _ = _run("true", inner, when=when, extra=extra)
        assert booked == []
        assert want in _shown(model)[2]


def test_a_secret_value_never_decides_a_call() -> None:
    world, booked = World(), []  # type: ignore[var-annotated]

    def step(request: Any) -> Any:
        tools = [m for m in request.messages if m.role == "tool"]
        if not tools:
            return call("read_env")
        if len(tools) == 1:
            return call("call_if", handle=handle_in(tools[0].content), question="Is MODE dev?",
                        answer_type="boolean", when="true", **BOOK)
        return "done"

    model = ScriptedModel(step)
    policy = SafetyPolicy(query_model=ScriptedModel(["true"]))
    Agent(model, tools=_tools(world, booked), policy=policy, limits=Limits(max_steps=5)).run("go")
    assert booked == []
    assert "refused:secret" in _shown(model)[2]  # the secret never reaches the reader of call_if


def test_the_record_holds_the_outcome_for_the_user() -> None:
    model, res, _, _, _ = _run("true", BOOK)
    handle = handle_in(_shown(model)[2])
    record = json.loads(res.state.policy["values"]["values"][handle]["value"])
    assert record == {"condition": "met", "call": "book", "ran": True, "error": False, "result": "booked Le Petit"}


def test_an_enum_condition_runs_only_on_its_option() -> None:
    for reply, runs in (("hotel", True), ("flight", False)):
        _, _, _, booked, _ = _run(reply, BOOK, when="hotel",
                                  extra={"answer_type": "enum", "options": ["hotel", "flight"]})
        assert bool(booked) is runs


def _note_tool(booked: list[str]) -> Tool:
    @tool(effect="reversible", untrusted_output=True, hide_output=False)
    def note(text: str) -> str:
        """Write a note."""
        booked.append(text)
        return f"noted: {text}"

    return note


def test_no_note_about_the_inner_call_reaches_the_model() -> None:
    """An inner tool whose output is untrusted and shown would get the turn's "data from outside" note,
    which would tell the model the call ran; the note is left out (the output is in the hidden record)."""
    seen = []
    for reply in ("true", "false"):
        world, booked = World(), []  # type: ignore[var-annotated]
        note = _note_tool(booked)

        def step(request: Any) -> Any:
            tools = [m for m in request.messages if m.role == "tool"]
            if not tools:
                return call("read_email", id=1)
            if len(tools) == 1:
                return call("call_if", handle=handle_in(tools[0].content), question="Is it urgent?",
                            answer_type="boolean", when="true", tool="note", arguments={"text": "call back"})
            return "done"

        model = ScriptedModel(step)
        policy = SafetyPolicy(query_model=ScriptedModel([reply]))
        Agent(model, tools=[*world.tools(), note], policy=policy, limits=Limits(max_steps=5)).run("go")
        assert bool(booked) is (reply == "true")
        seen.append([m.content for m in model.requests[-1].messages])
    assert seen[0] == seen[1]
