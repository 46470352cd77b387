"""Types every checker accepts (issue 38, item 6): the event union is what returns events, tool-call
decisions are a `CallDecision`, and the public modules `mypy --strict` checks (pyproject.toml) are
all of them. The checkers themselves run in CI (.ci/run)."""

from __future__ import annotations

import ast
import tomllib
import typing
from pathlib import Path
from typing import Any

from tether import (
    Agent,
    BasePolicy,
    CallContext,
    CallDecision,
    RunResult,
    ScriptedModel,
    Tool,
    ToolCall,
    Verdict,
    call,
    events,
    reply,
    tool,
)
from tether.events import ToolCallEnded

ROOT = Path(__file__).resolve().parent.parent
# every package a user imports (the CLI and the HTTP service are programs)
PUBLIC = ["__init__", "events", "team", "tools/__init__", "policy/__init__", "models/__init__", "rag/__init__",
          "durable/__init__", "mcp/__init__", "evals/__init__", "store/__init__", "staging/__init__",
          "context/__init__", "plan/__init__", "telemetry/__init__"]


def test_events_are_returned_as_the_event_union() -> None:
    assert typing.get_type_hints(RunResult.events.fget, include_extras=True)["return"] == list[events.Event]
    for fn in (events.typed, events.stored, events.from_json):
        assert typing.get_type_hints(fn, include_extras=True)["return"] == events.Event, fn.__name__


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


@tool
def wipe(target: str) -> str:
    """Delete everything."""
    return "wiped"


class NoWipe(BasePolicy):
    async def before_call(self, tool: Tool, args: dict[str, Any], call: ToolCall, ctx: CallContext) -> Verdict:
        return Verdict("refuse", "never", "refused:no_wipe") if tool.name == "wipe" else Verdict()


def test_every_decision_a_run_records_is_a_call_decision() -> None:
    model = ScriptedModel([call("lookup", q="x"), call("wipe", target="all"), call("nosuch"),
                           call("lookup", wrong=1), reply("done")])
    result = Agent(model, tools=[lookup, wipe], policy=NoWipe()).run("go")
    decisions = [e.decision for e in result.events if isinstance(e, ToolCallEnded)]
    assert [CallDecision.of(d) for d in decisions] == [
        CallDecision.ALLOWED, CallDecision.REFUSED, CallDecision.UNKNOWN_TOOL, CallDecision.INVALID_ARGUMENTS]
    assert decisions[0] == CallDecision.ALLOWED and decisions[1] == "refused:no_wipe"  # still plain strings
    assert CallDecision.of("approved:alice") is CallDecision.APPROVED and CallDecision.of("made_up") is None


def _defining_modules() -> set[str]:
    """The public packages and every tether module they import names from."""
    found = set()
    for name in PUBLIC:
        path = ROOT / "src/tether" / f"{name}.py"
        found.add(path.relative_to(ROOT).as_posix())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tether"):
                base = ROOT / "src" / node.module.replace(".", "/")
                module = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
                found.add(module.relative_to(ROOT).as_posix())
    return found


def test_mypy_checks_every_public_module() -> None:
    """A module a public package starts exporting from must join [tool.mypy]'s files."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["strict"] is True
    missing = _defining_modules() - set(config["files"])
    assert missing == set(), f"add to [tool.mypy] files in pyproject.toml: {sorted(missing)}"


def _literal_decisions(tree: ast.AST) -> list[tuple[int, str]]:
    """String literals given as a call's decision: `Stop("...")`, `Verdict(_, _, "...")`, `decision="..."`,
    `x.decision = "..."` (a conditional's either side too), where the string is a CallDecision's value."""
    kinds = {d.value for d in CallDecision}

    def literals(node: ast.AST | None) -> list[tuple[int, str]]:
        if isinstance(node, ast.IfExp):
            return literals(node.body) + literals(node.orelse)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.partition(":")[0] in kinds:
            return [(node.lineno, node.value)]
        return []

    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name == "Stop" and node.args:
                found += literals(node.args[0])
            if name == "Verdict" and len(node.args) > 2:
                found += literals(node.args[2])
            found += [hit for k in node.keywords if k.arg == "decision" for hit in literals(k.value)]
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "decision"
                                                  for t in node.targets):
            found += literals(node.value)
    return found


def test_guards_and_plan_mode_create_decisions_as_call_decisions() -> None:
    """A decision is made from `CallDecision` (`f"{CallDecision.REFUSED}:taint"`, not `"refused:taint"`),
    so a renamed kind cannot leave a string behind; serialised, it is the same string."""
    src = ROOT / "src" / "tether"
    strings = {f"{p.relative_to(src)}:{line}": text
               for p in [*src.glob("policy/**/*.py"), *src.glob("plan/*.py")]
               for line, text in _literal_decisions(ast.parse(p.read_text()))}
    assert strings == {}
