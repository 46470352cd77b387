"""Per-tool, per-argument policies for plan mode: Python callables over the arguments' labels
(`tether.values.Label`), checked by the interpreter before every tool call, after the one
confidentiality check every call gets (`confidentiality`: secrets and readers, by declaration).

A policy gets a `PlanCall` (the tool, each argument as a `Value`, the control flow the call is made
under) and returns `ALLOW`, `ask(reason)` or `deny(reason)`. Declare one with the tool
(`@tool(metadata={"plan_policy": fn})`) or pass `policies={"send_money": fn}` to the plan run;
a tool with neither gets `default_policy`.

Text a call sends to people (a message body, an e-mail's text, a posted page) is judged by its label,
not by what it looks like: an argument named in `text=` that derives from anything but the user and
trusted tools (or is sent under such control flow) goes out with every link in it defanged
(`hxxps://`, `example[.]com`, `203[.]0[.]113[.]7`), so nothing the attacker wrote is a live link.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, cast

from tether._types import Effect
from tether.plan._values import USER, Label, Value, deep_label, join_all, plain
from tether.tools._base import Tool
from tether.values._readers import leak


@dataclass(frozen=True, slots=True)
class Decision:
    """What a policy decided; `rewrite`: arguments the call is made with instead (defanged text),
    shown to the approver as they will be sent."""

    action: Literal["allow", "ask", "deny"]
    reason: str = ""
    rewrite: tuple[tuple[str, Any], ...] = ()


ALLOW = Decision("allow")


def ask(reason: str) -> Decision:
    """A person approves this exact call first (refused without one)."""
    return Decision("ask", reason)


def deny(reason: str) -> Decision:
    """Refused; the plan fails at this call and the planner hears why (never the values)."""
    return Decision("deny", reason)


@dataclass(frozen=True, slots=True)
class PlanCall:
    """One tool call a plan is about to make, as a policy sees it."""

    tool: Tool
    args: dict[str, Value]
    pc: Label  # the label of every condition and loop the call is made under
    trusted: frozenset[str]  # the trusted sources ("user", "tool:NAME" of trusted tools): named in reasons

    def label(self, *names: str) -> Label:
        """Everything the named arguments (all when none are named) depend on, with the control flow."""
        chosen = names or tuple(self.args)
        return join_all(deep_label(self.args[n]) for n in chosen if n in self.args) | self.pc

    def from_user(self, *names: str) -> bool:
        """The named arguments (and the control flow) come from the user's request alone."""
        return self.label(*names).sources <= {USER}

    def is_trusted(self, *names: str) -> bool:
        """The named arguments (and the control flow) come from the user or trusted tools: their
        label's integrity is trusted."""
        return not self.label(*names).untrusted

    def private(self, *names: str) -> bool:
        """The named arguments carry data only some readers may see (a private tool output)."""
        return self.label(*names).readers is not None

    def carriers(self) -> list[str]:
        """The arguments holding data only some readers may see."""
        return [n for n, v in self.args.items() if deep_label(v).readers is not None]

    def leak(self) -> str | None:
        """Why this call would let data reach someone outside its readers, by the arguments' labels
        and the tool's declared `sends_to` (tether.values._readers); None when it would not."""
        return leak(self.tool, {k: plain(v) for k, v in self.args.items()}, self.label(), self.carriers(),
                    lambda names: self.from_user(*names) if names else self.pc.sources <= {USER})

    def flows(self) -> dict[str, str]:
        """Each argument's sources, and the control flow's: what an approver or a refusal shows."""
        out = {name: ", ".join(sorted(deep_label(v).sources)) or "no source" for name, v in self.args.items()}
        if self.pc.sources:
            out["(control flow)"] = ", ".join(sorted(self.pc.sources))
        return out

    def untrusted(self) -> str:
        """The arguments with a source outside the trusted ones, as "name <- sources"."""
        bad = []
        for name, v in [*self.args.items(), ("(control flow)", Value(None, self.pc))]:
            extra = sorted(deep_label(v).sources - self.trusted)
            if extra:
                bad.append(f"{name} <- {', '.join(extra)}")
        return "; ".join(bad)


PlanPolicy = Callable[[PlanCall], Decision]


def confidentiality(call: PlanCall) -> Decision | None:
    """Checked before every call's own policy, whatever that is: a secret goes only to a tool declared
    `secret_sink`; data with readers goes only to them, or where the user said (`PlanCall.leak`),
    else a person decides (the tool's `on_leak="refuse"`: refused). None: nothing to object to."""
    label = call.label()
    if label.secret and not call.tool.declared.secret_sink:
        return deny(f"a secret ({', '.join(call.carriers()) or 'the control flow'}) would go to "
                    f"'{call.tool.name}', which is not declared to take secrets")
    why = call.leak()
    if why is None:
        return None
    if not call.from_user(*[n for n in call.args if n not in call.carriers()]):
        why += ": " + (call.untrusted() or "the destination is not from the user's request")
    return deny(why) if call.tool.declared.on_leak == "refuse" else ask(why)


def combine(policy: Decision, confidential: Decision | None) -> Decision:
    """The stricter of a call's own policy and the confidentiality check (deny, then ask), with the
    policy's rewrites (defanged text) kept and both reasons given."""
    if confidential is None or confidential.action == "allow":
        return policy
    rank = {"allow": 0, "ask": 1, "deny": 2}
    action = policy.action if rank[policy.action] >= rank[confidential.action] else confidential.action
    reasons = [d.reason for d in (confidential, policy) if d.action != "allow" and d.reason]
    return Decision(action, "; ".join(reasons), policy.rewrite)


def default_policy(call: PlanCall) -> Decision:
    """Reads run. A call with an effect runs when every argument and the control flow come from the
    user or trusted tools; else a person decides, shown the exact flows. (Where private data may go
    is checked for every call, whatever its policy: `confidentiality`.)"""
    if call.tool.effect is Effect.READ_ONLY and call.tool.effect_declared:
        return ALLOW
    if call.is_trusted():
        return ALLOW
    return ask(f"'{call.tool.name}' has an effect and its arguments come from untrusted sources: {call.untrusted()}")


def trusted_args(*names: str, otherwise: Literal["ask", "deny"] = "ask", text: Iterable[str] = ()) -> PlanPolicy:
    """A policy: the named arguments (and the control flow) must come from the user or trusted
    tools; the others may carry anything (a body, a summary). `text`: arguments that are text sent to
    people, defanged when they derive from anything else (`outgoing_text`)."""
    return _require(PlanCall.is_trusted, names, "the user or a trusted tool", otherwise, tuple(text))


def user_args(*names: str, otherwise: Literal["ask", "deny"] = "ask", text: Iterable[str] = ()) -> PlanPolicy:
    """A policy: the named arguments (all when none are named; and the control flow) must come from
    the user's request. `text` as for `trusted_args`."""
    return _require(PlanCall.from_user, names, "the user's request", otherwise, tuple(text))


def outgoing_text(*names: str) -> PlanPolicy:
    """A policy: the named arguments are text sent to people (a body, an e-mail's text). Allowed;
    when one derives from a source outside the trusted ones, or is sent under control flow that
    does, every link in it is defanged (`defang`) before the call is made."""
    def check(call: PlanCall) -> Decision:
        return Decision("allow", "", _defanged(call, names))
    return check


def _defanged(call: PlanCall, names: Iterable[str]) -> tuple[tuple[str, Any], ...]:
    out = []
    for n in names:
        if n in call.args and not call.is_trusted(n):
            v = plain(call.args[n])
            new = defang(v) if isinstance(v, str) else [defang(x) if isinstance(x, str) else x for x in v] \
                if isinstance(v, list) else v
            if new != v:
                out.append((n, new))
    return tuple(out)


def _require(test: Callable[..., bool], names: tuple[str, ...], where: str,
             otherwise: Literal["ask", "deny"], text: tuple[str, ...] = ()) -> PlanPolicy:
    def check(call: PlanCall) -> Decision:
        rewrite = _defanged(call, text)
        if test(call, *names):
            return Decision("allow", "", rewrite)
        why = f"{', '.join(names) or 'every argument'} must come from {where}: {call.untrusted()}"
        return Decision("ask", why, rewrite) if otherwise == "ask" else deny(why)
    return check


_ZW = "[\u200b-\u200d\u2060\ufeff\u00ad]*"  # invisible characters a link could hide its dots behind
_DOT = "[.\u3002\uff0e\uff61]"  # a dot, and the full stops that browsers read as one
# a dot with something before it and a letter after: every host name (secure-systems-252.pl,
# www.x.com, a .zip), file names and abbreviations too (better a "report[.]pdf" than a live link)
_HOST_DOT = re.compile(f"(?<=\\S){_ZW}{_DOT}{_ZW}(?=[^\\W\\d_])")
_IP = re.compile(f"\\d+(?:{_ZW}{_DOT}{_ZW}\\d+){{3}}")
_SCHEME = re.compile(r"(?i)\b(ht|f)tp(s?)(:)|:(//)")


def defang(text: str) -> str:
    """`text` with no live link: schemes become `hxxp(s)`/`fxp` and `[:]//`, the dots of host names
    and IP addresses `[.]` (any `name.tld/...`, with or without a scheme or `www.`)."""
    text = _IP.sub(lambda m: re.sub(f"{_ZW}{_DOT}{_ZW}", "[.]", m.group(0)), text)
    text = _HOST_DOT.sub("[.]", text)
    return _SCHEME.sub(lambda m: f"{'hx' if m.group(1).lower() == 'ht' else 'fx'}xp{m.group(2)}[:]"
                       if m.group(1) else "[:]//", text)


def _reads(call: PlanCall) -> Decision:
    return ALLOW


# The built-in tools: reads run; a write's path must be trusted (its content may be anything, and is not
# defanged: it is the user's file, not a message);
# a shell command built from untrusted content is refused, untrusted text on its stdin asks.
_BASH_COMMAND = trusted_args("command", otherwise="deny")
_BASH_STDIN = trusted_args("stdin")


def _bash(call: PlanCall) -> Decision:
    """A command built from untrusted content is refused; untrusted text on its stdin asks (a command
    may run what it reads: `bash`, `python -`)."""
    decided = _BASH_COMMAND(call)
    return decided if decided.action != "allow" or "stdin" not in call.args else _BASH_STDIN(call)


BUILTIN_POLICIES: dict[str, PlanPolicy] = {
    "Read": _reads, "Glob": _reads, "Grep": _reads, "calculator": _reads,
    "Write": trusted_args("file_path"), "Edit": trusted_args("file_path"),
    "Bash": _bash,
}


def policy_for(tool: Tool, policies: dict[str, PlanPolicy]) -> PlanPolicy:
    """The policy a call of `tool` is checked by: given for the run, declared with the tool, built in,
    else the default."""
    found: Any = policies.get(tool.name) or tool.metadata.get("plan_policy") or BUILTIN_POLICIES.get(tool.name)
    return cast(PlanPolicy, found) if callable(found) else default_policy


def trusted_sources(tools: Iterable[Tool], trusted_tools: Iterable[str]) -> frozenset[str]:
    """"user" and the trusted tools' sources: tools named trusted, except those whose output is
    untrusted by declaration."""
    names = set(trusted_tools)
    return frozenset({USER} | {f"tool:{t.name}" for t in tools if t.name in names and not t.untrusted_output})
