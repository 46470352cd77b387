"""Scenario suites: a TOML (or YAML) file listing scenarios and what each must show.

    [suite]
    name = "ops-assistant"
    agent = "agent.py:build_agent"    # relative to this file, or "package.module:function"
    cassettes = "cassettes"           # <id>.json per scenario (recorded, replayed by default)
    concurrency = 4

    [[scenario]]
    id = "checkout-latency"
    prompt = "Why is checkout latency up?"
    user = "alice"
    approve = [{ tool = "restart_service", arguments = { service = "payments-api", reason = "pool" } }]
    limits = { max_steps = 12 }
    script = [                         # a scripted model: used to record the cassette, or when none exists
      { call = "query_metrics", args = { service = "checkout", metric = "latency_p99_ms" } },
      { answer = "payments-api's pool was cut to 5 by the v2.14.0 deploy at 10:10" },
    ]
    [scenario.expect]
    contains = ["v2.14.0"]
    required_tools = ["query_metrics"]

The agent factory is called as `factory(model, user=..., approver=..., limits=..., wrap_tools=...)`
and returns an `Agent` whose tools it passed through `wrap_tools` (so replays can swap them).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tether._errors import TetherError
from tether._limits import Limits
from tether._refs import load_ref
from tether._types import ToolCall
from tether.models._scripted import ScriptItem


class SuiteError(TetherError, ValueError):
    """A suite file that cannot be used, with what to change."""


@dataclass(slots=True)
class Expect:
    """What a scenario must show. Every field is optional; see docs/evals.md."""

    contains: list[str] = field(default_factory=list)  # each, case-insensitive, in the answer
    not_contains: list[str] = field(default_factory=list)
    regex: str | None = None
    predicate: str | None = None  # "module:function" or "file.py:function": (result, agent) -> bool | str
    judge: str | None = None  # criteria for a judge model (needs --judge-model)
    required_tools: list[str] = field(default_factory=list)  # ran at least once (a refused call does not count)
    forbidden_tools: list[str] = field(default_factory=list)  # never executed successfully
    forbidden_attempts: list[str] = field(default_factory=list)  # never even asked for (refused or not)
    allowed_actions: list[str] | None = None  # effectful tools the task needs; None: those in `approve`
    max_steps: int | None = None
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    stop_reason: str | None = "completed"
    min_findings: int = 0
    no_unapproved_irreversible: bool = True


@dataclass(slots=True)
class Scenario:
    id: str
    prompt: str
    user: str | None = None
    approve: list[dict[str, Any]] = field(default_factory=list)
    limits: dict[str, Any] = field(default_factory=dict)
    script: list[dict[str, Any]] = field(default_factory=list)
    expect: Expect = field(default_factory=Expect)
    tags: list[str] = field(default_factory=list)

    def script_items(self) -> list[ScriptItem]:
        """The script as ScriptedModel items, with call ids that are stable across runs."""
        items: list[ScriptItem] = []
        n = 0

        def one(spec: dict[str, Any]) -> ToolCall:
            nonlocal n
            n += 1
            return ToolCall(f"call_{n}", spec["call"], dict(spec.get("args", {})))

        for i, step in enumerate(self.script):
            if "answer" in step:
                items.append(str(step["answer"]))
            elif "call" in step:
                items.append(one(step))
            elif "calls" in step:
                items.append([one(s) for s in step["calls"]])
            else:
                raise SuiteError(f"scenario {self.id!r}: script step {i + 1} needs 'answer', 'call' or 'calls'")
        return items

    def run_limits(self, base: Limits | None) -> Limits | None:
        if not self.limits:
            return base
        known = {f.name for f in fields(Limits)}
        bad = sorted(set(self.limits) - known)
        if bad:
            raise SuiteError(f"scenario {self.id!r}: unknown limits {bad}; known: {sorted(known)}")
        current = {f.name: getattr(base, f.name) for f in fields(Limits)} if base else {}
        return Limits(**{**current, **self.limits})


@dataclass(slots=True)
class Suite:
    name: str
    path: Path
    factory: Callable[..., Any]
    scenarios: list[Scenario]
    cassettes: Path | None = None
    concurrency: int = 4

    def cassette_path(self, scenario: Scenario) -> Path | None:
        return None if self.cassettes is None else self.cassettes / f"{scenario.id}.json"


def load_suite(path: str | Path) -> Suite:
    """Read and check a suite file; every mistake is one `SuiteError` naming what to change."""
    path = Path(path)
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise SuiteError(f"cannot read suite {path}: {exc.strerror or exc}") from exc
    data = _parse(path, text)
    head = data.get("suite") or {}
    if not isinstance(head, dict) or not head.get("agent"):
        raise SuiteError(f"{path}: [suite] needs agent = \"file.py:function\" (the agent factory)")
    raw = data.get("scenario") or data.get("scenarios") or []
    if not isinstance(raw, list) or not raw:
        raise SuiteError(f"{path}: no [[scenario]] entries")
    scenarios: list[Scenario] = []
    seen: set[str] = set()
    expect_fields = {f.name for f in fields(Expect)}
    scenario_fields = {f.name for f in fields(Scenario)}
    for i, item in enumerate(raw, 1):
        if not isinstance(item, dict) or not item.get("id") or not item.get("prompt"):
            raise SuiteError(f"{path}: scenario {i} needs an id and a prompt")
        sid = str(item["id"])
        if sid in seen:
            raise SuiteError(f"{path}: two scenarios are named {sid!r}")
        seen.add(sid)
        unknown = sorted(set(item) - scenario_fields)
        if unknown:
            raise SuiteError(f"{path}: scenario {sid!r} has unknown keys {unknown}")
        exp = dict(item.get("expect") or {})
        bad = sorted(set(exp) - expect_fields)
        if bad:
            raise SuiteError(f"{path}: scenario {sid!r}: unknown expectations {bad}; known: {sorted(expect_fields)}")
        sc = Scenario(**{**item, "id": sid, "expect": Expect(**exp)})
        sc.script_items()  # fail now on a malformed script
        scenarios.append(sc)
    cassettes = head.get("cassettes")
    return Suite(
        name=str(head.get("name") or path.stem), path=path, factory=_load_factory(path, str(head["agent"])),
        scenarios=scenarios, cassettes=(path.parent / cassettes) if cassettes else None,
        concurrency=int(head.get("concurrency", 4)),
    )


def _parse(path: Path, text: str) -> dict[str, Any]:
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as exc:
            raise SuiteError(f"{path}: YAML suites need PyYAML (pip install pyyaml), or use TOML") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SuiteError(f"{path}: invalid YAML: {exc}") from exc
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise SuiteError(f"{path}: invalid TOML: {exc}") from exc
    if not isinstance(data, dict):
        raise SuiteError(f"{path}: a suite is a table with [suite] and [[scenario]] entries")
    return data


def load_callable(ref: str, base: Path) -> Callable[..., Any]:
    """`file.py:name` (relative to `base`) or `package.module:name`."""
    try:
        fn = load_ref(ref, base)
    except LookupError as exc:
        raise SuiteError(str(exc)) from exc
    if not callable(fn):
        raise SuiteError(f"{ref!r} is not a function")
    loaded: Callable[..., Any] = fn
    return loaded


def _load_factory(path: Path, ref: str) -> Callable[..., Any]:
    return load_callable(ref, path.parent)
