"""Confidentiality by label in both modes: who may read a tool's output (declared `output_readers`),
who reads what a call sends (`sends_to`), and the question asked (or the refusal) when a value would
reach someone outside its readers. Properties: readers join through containers in plan mode and
through records and substitution in the loop."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tether._agent import Agent
from tether._limits import Limits
from tether.models._scripted import ScriptedModel, call
from tether.plan import Interpreter, Label, PlanMode, Value, deep_label, tag
from tether.policy import ApprovalRequest, CallbackApprover, SafetyPolicy
from tether.tools._base import Tool, tool
from tether.values import HANDLE, TRUSTED, USER, ValueStore, join_all
from tether.values._readers import audience, leak, output_label

ALICE, BOB, CAROL = "alice@corp.example", "bob@corp.example", "carol@else.example"
INBOX = [{"id": 1, "sender": ALICE, "recipients": ["me@home.example"], "body": "Q3 numbers: 4.2M"},
         {"id": 2, "sender": f"Carol <{CAROL}>", "recipients": ["me@home.example"], "body": "lunch?"}]


class Mail:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.posted: list[str] = []

    def tools(self, *, on_leak: str = "approve") -> list[Tool]:
        @tool(effect="read_only", output_readers=("sender", "recipients"))
        def read_inbox() -> str:
            """The user's inbox: each e-mail readable by the user, its sender and its recipients."""
            return json.dumps(INBOX)

        @tool(effect="read_only", output_readers=("sender", "recipients"))
        def read_email(id: int) -> str:
            """One e-mail of the user's inbox."""
            return json.dumps(INBOX[id - 1])

        @tool(effect="irreversible", sends_to=("recipients",), on_leak=on_leak)  # type: ignore[arg-type]
        def send_email(recipients: list[str], body: str) -> str:
            """Send an e-mail."""
            self.sent.append({"recipients": recipients, "body": body})
            return "sent"

        @tool(effect="irreversible", sends_to="public")
        def post_channel(channel: str, text: str) -> str:
            """Post to a channel everyone in the company reads."""
            self.posted.append(text)
            return "posted"

        @tool(effect="read_only")
        def weather() -> str:
            """Today's weather (public)."""
            return json.dumps({"sky": "clear"})

        return [read_inbox, read_email, send_email, post_channel, weather]


# -- plan mode -------------------------------------------------------------------------------------


def plan_run(program: str, *, approve: bool = False, on_leak: str = "approve") -> tuple[Mail, list[ApprovalRequest], Any]:
    mail, asked = Mail(), []
    tools = mail.tools(on_leak=on_leak)
    pm = PlanMode(ScriptedModel([f"```python\n{program}\n```"]), tools,
                  approver=CallbackApprover(lambda r: asked.append(r) or approve),
                  trusted_tools=[t.name for t in tools], max_attempts=1)
    return mail, asked, pm.run("do it")


def test_plan_a_reply_to_an_emails_own_sender_asks_nobody() -> None:
    mail, asked, result = plan_run('m = read_inbox()[0]\nsend_email(recipients=[m["sender"]], body=m["body"])\n'
                                   'final_answer("ok")')
    assert result.completed and asked == [] and mail.sent == [{"recipients": [ALICE], "body": "Q3 numbers: 4.2M"}]


def test_plan_an_emails_body_sent_to_someone_outside_its_readers_asks_by_label() -> None:
    """Every value is from trusted tools (integrity alone would let it run); the recipient comes from
    the second e-mail, so she may not read the first one's body: a person decides, and is shown why
    without the address (reasons reach the planner on a refusal)."""
    mail, asked, result = plan_run('box = read_inbox()\n'
                                   'send_email(recipients=[box[1]["sender"]], body=box[0]["body"])\n'
                                   'final_answer("ok")')
    assert not result.completed and mail.sent == []
    assert [r.tool for r in asked] == ["send_email"]
    assert "readable only by the user and 1 named reader" in asked[0].reason and "outside them" in asked[0].reason
    assert CAROL not in asked[0].reason and ALICE not in " ".join(result.errors)


def test_plan_a_recipient_the_user_named_is_the_users_choice() -> None:
    mail, asked, result = plan_run('m = read_email(id=1)\nsend_email(recipients=["boss@home.example"], body=m["body"])\n'
                                   'final_answer("ok")')
    assert result.completed and asked == [] and mail.sent[0]["recipients"] == ["boss@home.example"]


def test_plan_a_public_sink_asks_and_on_leak_refuse_refuses() -> None:
    _, asked, result = plan_run('m = read_email(id=1)\npost_channel(channel="general", text=m["body"])\nfinal_answer("ok")')
    assert not result.completed and [r.tool for r in asked] == ["post_channel"] and "anyone may read" in asked[0].reason
    mail, asked, result = plan_run('box = read_inbox()\nsend_email(recipients=[box[1]["sender"]], body=box[0]["body"])\n'
                                   'final_answer("ok")', approve=True, on_leak="refuse")
    assert asked == [] and mail.sent == [] and "send_email was refused" in result.errors[0]


def test_plan_public_values_flow_freely() -> None:
    mail, asked, result = plan_run('w = weather()\npost_channel(channel="general", text=w["sky"])\n'
                                   'send_email(recipients=[read_inbox()[1]["sender"]], body=w["sky"])\nfinal_answer("ok")')
    assert result.completed and asked == [] and mail.posted == ["clear"] and len(mail.sent) == 1


def test_plan_each_record_carries_its_own_readers_and_the_list_all_of_theirs() -> None:
    mail, _, result = plan_run('box = read_inbox()\nfinal_answer(box)')
    assert result.completed
    tools = {t.name: t for t in mail.tools()}
    assert output_label(tools["read_inbox"], json.dumps(INBOX)).readers == frozenset({USER, "me@home.example"})
    assert output_label(tools["read_email"], "not json").readers == frozenset({USER})  # fail closed
    assert output_label(tools["weather"], "{}") == TRUSTED
    assert audience(tools["send_email"], {"recipients": ["Bob <BOB@corp.example>"]}) == frozenset({USER, BOB})


# -- the loop (hidden values) ----------------------------------------------------------------------


def loop_run(to: list[str], *, sink: str = "send_email", approve: bool = True,
             on_leak: str = "approve") -> tuple[Mail, list[ApprovalRequest]]:
    mail, asked = Mail(), []

    def step(request: Any) -> Any:
        tool_msgs = [m for m in request.messages if m.role == "tool"]
        if not tool_msgs:
            return call("read_email", id=1)
        if len(tool_msgs) == 1:
            m = HANDLE.search(tool_msgs[0].content)
            assert m is not None, tool_msgs[0].content  # a mail with readers is hidden behind a handle
            body = f"{m.group()}.body"
            return call(sink, recipients=to, body=body) if sink == "send_email" else \
                call(sink, channel="general", text=body)
        return "done"

    policy = SafetyPolicy(approver=CallbackApprover(lambda r: asked.append(r) or approve))
    Agent(ScriptedModel(step), tools=mail.tools(on_leak=on_leak), policy=policy, limits=Limits(max_steps=6)).run("go")
    return mail, asked


def test_loop_a_hidden_body_to_its_own_readers_asks_nobody() -> None:
    mail, asked = loop_run([ALICE])
    assert asked == [] and mail.sent == [{"recipients": [ALICE], "body": "Q3 numbers: 4.2M"}]


def test_loop_a_hidden_body_to_another_address_or_a_channel_asks_by_its_label() -> None:
    mail, asked = loop_run([CAROL], approve=False)
    assert mail.sent == [] and [r.tool for r in asked] == ["send_email"]
    assert "readable only by the user and 2 named readers" in asked[0].reason
    mail, asked = loop_run([], sink="post_channel", approve=False)
    assert mail.posted == [] and [r.tool for r in asked] == ["post_channel"] and "anyone may read" in asked[0].reason
    mail, asked = loop_run([CAROL], on_leak="refuse")  # declared: refused, nobody asked
    assert mail.sent == [] and asked == []


# -- properties: readers join through containers -----------------------------------------------

READERS = st.none() | st.frozensets(st.sampled_from([USER, ALICE, BOB, CAROL]))


def _meet(*rs: frozenset[str] | None) -> frozenset[str] | None:
    out: frozenset[str] | None = None
    for r in rs:
        out = r if out is None else out if r is None else out & r
    return out


async def _no_tools(name: str, args: dict[str, Value], pc: Label) -> Value:
    raise AssertionError(name)


@settings(max_examples=60, deadline=None)
@given(READERS, READERS, READERS, st.booleans())
def test_plan_readers_meet_through_containers_mutation_and_branches(ra: frozenset[str] | None,
                                                                   rb: frozenset[str] | None,
                                                                   rc: frozenset[str] | None, flag: bool) -> None:
    env = {"a": tag({"k": "x", "n": [1, 2]}, Label(readers=ra)), "b": tag("y", Label(readers=rb)),
           "c": tag(flag, Label(readers=rc))}
    program = ('box = {"first": a}\nbox["second"] = [b]\nbox["second"].append(a["n"][0])\n'
               's = f"{a[\'k\']}-{b}"\npicked = box["first"]["k"]\nif c:\n    t = b\nelse:\n    t = "z"\n'
               'final_answer([box, s, t])')
    interp = Interpreter(set(), _no_tools, env=env)
    asyncio.run(interp.run(program))
    assert interp.answer is not None
    box, s, t = interp.answer.v
    assert deep_label(box).readers == _meet(ra, rb)  # both went in: only who may read both reads it all
    assert s.label.readers == _meet(ra, rb)  # a string made of both
    assert deep_label(interp.env["picked"]).readers == ra  # a part keeps its own readers
    assert deep_label(t).readers == (_meet(rb, rc) if flag else rc)  # chosen under c: c's readers too
    assert deep_label(interp.answer).readers == _meet(ra, rb, rc)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([ALICE, BOB, CAROL]), st.lists(st.sampled_from([ALICE, BOB, CAROL]),
                                                                          max_size=2)), min_size=1, max_size=4),
       st.lists(st.sampled_from([ALICE, BOB, CAROL]), max_size=3))
def test_loop_readers_of_records_meet_and_a_call_asks_exactly_outside_them(records: list[tuple[str, list[str]]],
                                                                           to: list[str]) -> None:
    tools = {t.name: t for t in Mail().tools()}
    rows = [{"sender": s, "recipients": r, "body": "b"} for s, r in records]
    each = [frozenset({USER, s, *r}) for s, r in records]
    label = output_label(tools["read_inbox"], json.dumps(rows))
    assert label.readers == frozenset.intersection(*each)
    # substituted into a call inside a container: the binding carries the same readers
    store = ValueStore()
    store.hide("$v1_1", json.dumps(rows), label, "output")
    args = store.bind("c", 2, 0, {"recipients": to, "body": ["intro", "$v1_1"]})
    binding = store.take("c")
    assert binding is not None and binding.label == join_all([label])
    why = leak(tools["send_email"], args, binding.label, ["body"], lambda names: False)
    assert (why is None) == (set(to) <= label.readers)


# -- the loop, outputs the model was shown (visible mode, a tool that does not hide) ------------------


def shown_run(body: str, to: list[str], *, hidden_values: bool = False, on_leak: str = "approve",
              request: str = "go", read: str = "read_email") -> tuple[Mail, list[ApprovalRequest]]:
    """The model reads e-mail 1 (shown to it as it is) and sends `body` (`{copy}`: the e-mail's body) to `to`."""
    mail, asked = Mail(), []
    tools = mail.tools(on_leak=on_leak)
    if hidden_values:  # hiding on, but the reading tool declared visible: the model sees the text
        for t in tools:
            if t.name in ("read_email", "read_inbox"):
                t.hide_output = False

    def step(req: Any) -> Any:
        tool_msgs = [m for m in req.messages if m.role == "tool"]
        if not tool_msgs:
            return call(read, id=1) if read == "read_email" else call(read)
        if len(tool_msgs) == 1:
            assert HANDLE.search(tool_msgs[0].content) is None  # shown, not hidden
            return call("send_email", recipients=to, body=body.format(copy=INBOX[0]["body"]))
        return "done"

    policy = SafetyPolicy(approver=CallbackApprover(lambda r: asked.append(r) or False),
                          hidden_values=hidden_values)
    Agent(ScriptedModel(step), tools=tools, policy=policy, limits=Limits(max_steps=6)).run(request)
    return mail, asked


def test_shown_private_text_copied_outside_its_readers_asks_by_label() -> None:
    """Every tool is trusted and the run is never tainted: only the e-mail's readers object, found by the
    body's exact span in what the model was shown (visible mode, and a tool declared not to hide)."""
    for hidden_values in (False, True):
        mail, asked = shown_run("FYI, {copy} (from the board)", [CAROL], hidden_values=hidden_values)
        assert mail.sent == [] and [r.tool for r in asked] == ["send_email"], hidden_values
        assert "readable only by the user and 2 named readers" in asked[0].reason
        assert "outside them (recipients)" in asked[0].reason and CAROL not in asked[0].reason
    mail, asked = shown_run("{copy}", [CAROL], on_leak="refuse")
    assert mail.sent == [] and asked == []


def test_shown_private_text_to_its_own_readers_or_not_copied_asks_nobody() -> None:
    mail, asked = shown_run("{copy}", [ALICE])
    assert asked == [] and len(mail.sent) == 1
    mail, asked = shown_run("{copy}", [ALICE], read="read_inbox")  # each record its own readers, not their meet
    assert asked == [] and len(mail.sent) == 1
    mail, asked = shown_run("Let us talk about the quarter tomorrow.", [CAROL])  # nothing copied
    assert asked == [] and len(mail.sent) == 1
    mail, asked = shown_run("4.2M", [CAROL])  # a figure of the e-mail, whole
    assert mail.sent == [] and [r.tool for r in asked] == ["send_email"]
    mail, asked = shown_run("{copy}", [CAROL], request=f"Send the Q3 e-mail to {CAROL}")  # the user named her
    assert asked == [] and len(mail.sent) == 1


def test_shown_texts_survive_the_policy_state_dump() -> None:
    tools = {t.name: t for t in Mail().tools()}
    store = ValueStore(enabled=False)
    from tether.values._decide import note_shown, shown_leak
    note_shown(store, tools["read_email"], None, json.dumps(INBOX[0]), is_error=False)
    again = ValueStore.load(store.dump())
    assert again == store and len(again.shown) == 1
    args = {"recipients": [CAROL], "body": "Re: Q3 numbers: 4.2M"}
    assert shown_leak(again, tools["send_email"], args, set(), lambda names: False) is not None
    assert shown_leak(again, tools["send_email"], {**args, "recipients": [ALICE]}, set(), lambda n: False) is None
