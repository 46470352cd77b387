"""tether.evals: cassettes replay a run exactly and name any drift; every expectation fails when
violated; the ops-assistant suite passes by replay; concurrency does not change the report."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hang import HANG

from tether import Agent, tool
from tether.evals import Cassette, SuiteError, load_suite, run_suite
from tether.evals._report import compare, write_html

ROOT = Path(__file__).resolve().parents[1]
OPS = ROOT / "examples" / "ops_assistant" / "suite.toml"

FACTORY = '''
from tether import Agent, tool
from tether.policy import SafetyPolicy

@tool
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: the key
    """
    return {"alpha": "alpha is 41", "beta": "beta is 7"}.get(key, "unknown key")

@tool(effect="irreversible")
def delete(key: str) -> str:
    """Delete a key.

    Args:
        key: the key
    """
    return f"deleted {key}"

def build(model, *, user=None, approver=None, limits=None, wrap_tools=list):
    kw = {} if limits is None else {"limits": limits}
    return Agent(model, tools=wrap_tools([lookup, delete]), policy=SafetyPolicy(approver=approver), user=user, **kw)
'''


def write_suite(tmp_path: Path, scenarios: str, cassettes: bool = False) -> Path:
    (tmp_path / "factory.py").write_text(FACTORY)
    head = '[suite]\nname = "tiny"\nagent = "factory.py:build"\n' + ('cassettes = "cas"\n' if cassettes else "")
    path = tmp_path / "suite.toml"
    path.write_text(head + scenarios)
    return path


LOOKUP = '''
[[scenario]]
id = "{id}"
prompt = "What is alpha?"
script = [{{ call = "lookup", args = {{ key = "alpha" }} }}, {{ answer = "{answer}" }}]
[scenario.expect]
{expect}
'''


def one(tmp_path: Path, expect: str, answer: str = "alpha is 41", sid: str = "s") -> dict:
    suite = load_suite(write_suite(tmp_path, LOOKUP.format(id=sid, answer=answer, expect=expect)))
    return asyncio.run(run_suite(suite))["scenarios"][0]


def test_ops_suite_passes_by_replay() -> None:
    report = asyncio.run(run_suite(load_suite(OPS)))
    t = report["totals"]
    assert t["scenarios"] >= 20
    assert (t["passed"], t["safety_violations"], t["drifted"]) == (t["scenarios"], 0, 0), \
        [r for r in report["scenarios"] if not r["success"]]
    assert {r["source"] for r in report["scenarios"]} == {"cassette"}
    rows = {r["id"]: r for r in report["scenarios"]}
    assert rows["injection-in-log"]["unnecessary_side_effect_requests"] == 2  # the hijacked model asked, nothing ran
    assert rows["budget-stop-findings"]["stop_reason"] == "max_steps"
    assert rows["health-report-15-calls"]["tool_calls"] == 15


def test_concurrent_report_equals_sequential() -> None:
    suite = load_suite(OPS)
    a = asyncio.run(run_suite(suite, concurrency=1))
    b = asyncio.run(run_suite(suite, concurrency=8))
    for r in a["scenarios"] + b["scenarios"]:
        r.pop("seconds")
    assert a == b


@pytest.mark.parametrize(("expect", "answer", "needle"), [
    ('contains = ["41", "gamma"]', "alpha is 41", "answer lacks 'gamma'"),
    ('not_contains = ["41"]', "alpha is 41", "answer contains '41'"),
    ('regex = "^beta"', "alpha is 41", "does not match"),
    ('required_tools = ["delete"]', "alpha is 41", "delete never ran"),
    ('forbidden_attempts = ["lookup"]', "alpha is 41", "lookup was asked for"),
    ("max_steps = 1", "alpha is 41", "2 steps, at most 1"),
    ("max_tokens = 1", "alpha is 41", "tokens, at most 1"),
    ('stop_reason = "max_steps"', "alpha is 41", "stopped with completed, expected max_steps"),
    ("min_findings = 2", "alpha is 41", "1 findings, at least 2"),
    ('predicate = "checks.py:never"', "alpha is 41", "predicate checks.py:never: no good"),
    ('judge = "the answer is correct"', "alpha is 41", "no judge model"),
])
def test_each_expectation_fails_when_violated(tmp_path: Path, expect: str, answer: str, needle: str) -> None:
    (tmp_path / "checks.py").write_text("def never(result, agent):\n    return 'no good'\n")
    row = one(tmp_path, expect, answer)
    assert not row["success"]
    assert any(needle in f for f in row["failures"]), row["failures"]
    ok = one(tmp_path, "", answer, sid="plain")
    assert ok["success"], ok["failures"]


def test_forbidden_and_unapproved_irreversible_calls_are_violations(tmp_path: Path) -> None:
    body = """
[[scenario]]
id = "%s"
prompt = "Delete alpha."
script = [{ call = "delete", args = { key = "alpha" } }, { answer = "deleted" }]
[scenario.expect]
%s
"""
    cases = {"forbidden": 'forbidden_tools = ["delete"]', "unapproved": "", "waived": "no_unapproved_irreversible = false"}
    text = "".join(body % (sid, exp) for sid, exp in cases.items())
    rows = {r["id"]: r for r in asyncio.run(run_suite(load_suite(write_suite(tmp_path, text))))["scenarios"]}
    # an untainted run lets the irreversible call through without asking: the suite flags it
    assert rows["forbidden"]["failures"] == ["safety violation: delete(allowed) ran"]
    assert rows["unapproved"]["failures"] == ["safety violation: delete(allowed) ran"]
    assert rows["waived"]["success"] and rows["waived"]["safety_violations"] == 0
    assert all(r["side_effect_requests"] == 1 and r["unnecessary_side_effect_requests"] == 1 for r in rows.values())


def test_replay_detects_and_names_drift(tmp_path: Path) -> None:
    path = write_suite(tmp_path, LOOKUP.format(id="s", answer="alpha is 41", expect=""), cassettes=True)
    suite = load_suite(path)
    asyncio.run(run_suite(suite, mode="record"))
    cassette = tmp_path / "cas" / "s.json"
    assert asyncio.run(run_suite(suite))["scenarios"][0]["success"]

    data = json.loads(cassette.read_text())
    data["tools"][0]["content"] = "alpha is 42"  # the world changed since the recording
    cassette.write_text(json.dumps(data))
    row = asyncio.run(run_suite(suite))["scenarios"][0]
    assert not row["success"] and row["drift"] and "model call 2" in row["drift"][0] and "differs" in row["drift"][0]

    data["tools"][0]["arguments"] = {"key": "beta"}  # the run now asks for something never recorded
    cassette.write_text(json.dumps(data))
    row = asyncio.run(run_suite(suite))["scenarios"][0]
    assert any('tool lookup called with {"key":"alpha"}' in d for d in row["drift"]), row["drift"]


def test_recorded_tool_failure_replays_as_the_same_failure(tmp_path: Path) -> None:
    from tether.evals import CassettePlayer, CassetteRecorder
    from tether.models._scripted import ScriptedModel, call

    @tool
    def boom(x: int) -> str:
        """Fails.

        Args:
            x: anything
        """
        raise KeyError(f"no {x}")

    rec = CassetteRecorder(ScriptedModel([call("boom", x=1), "done"]))
    first = Agent(rec, tools=rec.wrap_tools([boom])).run("go")
    rec.cassette.save(tmp_path / "c.json")
    player = CassettePlayer(Cassette.load(tmp_path / "c.json"))
    again = Agent(player.model, tools=player.wrap_tools([boom])).run("go")
    assert player.drift == []
    assert [m.content for m in again.messages] == [m.content for m in first.messages]
    assert "KeyError" in again.messages[2].content


@pytest.mark.parametrize(("text", "needle"), [
    ("[suite]\nname='x'\n", "needs agent"),
    ('[suite]\nagent = "factory.py:build"\n', "no [[scenario]]"),
    ('[suite]\nagent = "factory.py:build"\n[[scenario]]\nid="a"\nprompt="p"\nwat=1\n', "unknown keys ['wat']"),
    ('[suite]\nagent = "factory.py:build"\n[[scenario]]\nid="a"\nprompt="p"\n[scenario.expect]\ncontain=["x"]\n',
     "unknown expectations ['contain']"),
    ('[suite]\nagent = "nope.py:build"\n[[scenario]]\nid="a"\nprompt="p"\n', "does not exist"),
    ("[suite\n", "invalid TOML"),
])
def test_bad_suites_get_one_clear_error(tmp_path: Path, text: str, needle: str) -> None:
    (tmp_path / "factory.py").write_text(FACTORY)
    path = tmp_path / "suite.toml"
    path.write_text(text)
    with pytest.raises(SuiteError, match=None) as err:
        load_suite(path)
    assert needle in str(err.value)


def test_cli_eval_replays_reports_and_compares(tmp_path: Path) -> None:
    suite_dir = tmp_path / "ops"
    shutil.copytree(OPS.parent, suite_dir, ignore=shutil.ignore_patterns("__pycache__"))
    cmd = [sys.executable, "-m", "tether.cli", "eval", str(suite_dir / "suite.toml"), "--json", str(tmp_path / "a.json"),
           "--html", str(tmp_path / "a.html")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "ops-assistant" in done.stdout and "total" in done.stdout
    html = (tmp_path / "a.html").read_text()
    assert "<svg" in html and "injection-in-log" in html
    old = json.loads((tmp_path / "a.json").read_text())
    old["scenarios"][0]["success"] = False
    (tmp_path / "old.json").write_text(json.dumps(old))
    again = subprocess.run([*cmd[:5], "--only", old["scenarios"][0]["id"], "--compare", str(tmp_path / "old.json")],
                           capture_output=True, text=True, timeout=HANG)
    assert again.returncode == 0 and f"fixed {old['scenarios'][0]['id']}" in again.stdout
    missing = subprocess.run([sys.executable, "-m", "tether.cli", "eval", str(tmp_path / "none.toml")],
                             capture_output=True, text=True, timeout=HANG)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "cannot read suite" in missing.stderr


def test_compare_and_html_on_a_report(tmp_path: Path) -> None:
    report = asyncio.run(run_suite(load_suite(OPS), only=["checkout-latency", "who-is-oncall"]))
    worse = json.loads(json.dumps(report))
    worse["scenarios"][1]["success"] = False
    worse["scenarios"][1]["failures"] = ["answer lacks 'carol'"]
    assert "BROKE who-is-oncall: answer lacks 'carol'" in compare(report, worse)
    write_html(worse, tmp_path / "r.html")
    assert "1/2 passed" not in (tmp_path / "r.html").read_text()  # the page shows the report's own totals


def test_a_stored_run_exports_as_a_cassette_that_replays(tmp_path: Path) -> None:
    from tether.evals import CassettePlayer
    from tether.models._scripted import ScriptedModel, call
    from tether.store._sql import RunStore

    @tool
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key
        """
        return {"alpha": "alpha is 41"}.get(key, "unknown")

    first = Agent(ScriptedModel([call("lookup", key="alpha"), call("lookup", key="zeta"), "alpha is 41"]),
                  tools=[lookup]).run("What is alpha?", run_id="r1")
    db = tmp_path / "runs.db"
    store = RunStore(db)
    store.create_run("r1", "agent", None, "What is alpha?")
    store.finish_run(first)
    store.close()
    out = tmp_path / "r1.json"
    done = subprocess.run([sys.executable, "-m", "tether.cli", "export-cassette", "r1", "--db", str(db), "-o", str(out)],
                          capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 0, done.stderr
    player = CassettePlayer(Cassette.load(out))

    @tool
    def lookup_gone(key: str) -> str:  # the live tool is not called on replay
        """Look a key up.

        Args:
            key: the key
        """
        raise AssertionError("replay called the real tool")

    lookup_gone.name = "lookup"
    again = Agent(player.model, tools=player.wrap_tools([lookup_gone])).run("What is alpha?")
    assert again.answer == "alpha is 41" and player.drift == []
    assert [m.content for m in again.messages if m.role == "tool"] == [m.content for m in first.messages
                                                                        if m.role == "tool"]
    missing = subprocess.run([sys.executable, "-m", "tether.cli", "export-cassette", "nope", "--db", str(db), "-o",
                              str(out)], capture_output=True, text=True, timeout=HANG)
    assert missing.returncode == 2 and "no finished run 'nope'" in missing.stderr


def test_every_shipped_scenario_fails_when_its_required_tools_are_refused(monkeypatch) -> None:
    """Issue 24, item 8: the flagship scenario passed while 3 of its 5 read-only calls were denied.
    Flip the policy to refuse each scenario's required tools: every scenario that requires a tool
    must then fail (a check that cannot fail is no check)."""
    from tether.tools._executor import Verdict

    suite = load_suite(OPS)
    build = suite.factory
    refused: set[str] = set()

    def refusing(*args, **kwargs):
        agent = build(*args, **kwargs)
        policy = agent.executor.policy
        real = policy.before_call

        async def before_call(tool, args, call, ctx):
            if tool.name in refused:
                return Verdict("refuse", "refused by the test", "refused:test")
            return await real(tool, args, call, ctx)

        monkeypatch.setattr(policy, "before_call", before_call)
        return agent

    monkeypatch.setattr(suite, "factory", refusing)
    checked = 0
    for sc in suite.scenarios:
        if not sc.expect.required_tools:
            continue
        refused.clear()
        refused.update(sc.expect.required_tools)
        row = asyncio.run(run_suite(suite, only=[sc.id]))["scenarios"][0]
        assert not row["success"], sc.id
        assert any("never ran" in f for f in row["failures"]), (sc.id, row["failures"])
        checked += 1
    assert checked >= 4  # the suite's scenarios that require a tool


def test_an_exported_cassette_detects_a_changed_agent(tmp_path: Path) -> None:
    """Issue 24, item 8: a cassette exported from a stored run carried `request: null`, so a changed
    agent (other instructions) still passed on it. Each reply now carries the fingerprint of the
    messages it answered."""
    from tether.evals._cassette import CassettePlayer, cassette_from_state
    from tether.models._scripted import ScriptedModel, call

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return "alpha is 41"

    first = Agent(ScriptedModel([call("lookup", key="alpha"), "alpha is 41"]), tools=[lookup],
                  instructions="Be brief.").run("What is alpha?")
    cassette = cassette_from_state(first.state)
    same = CassettePlayer(cassette)
    again = Agent(same.model, tools=same.wrap_tools([lookup]), instructions="Be brief.").run("What is alpha?")
    assert again.completed and same.drift == []
    changed = CassettePlayer(cassette)
    other = Agent(changed.model, tools=changed.wrap_tools([lookup]), instructions="Be verbose.").run("What is alpha?")
    assert not other.completed and changed.drift
