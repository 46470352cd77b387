"""`Declares`: what a tool tells the safety policy about its arguments and its output.

Given as `@tool(url_args=["url"], private_output=True, ...)`, `Tool(declares=Declares(...))` or
`Tool.from_schema(..., declares=...)`; read as `tool.declared`. The same names as keys of
`Tool.metadata` are deprecated (they still work, with a `DeprecationWarning`, until `REMOVED_IN`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from tether._compat import REMOVED_IN, user_stacklevel
from tether._types import Effect

OnUntrusted = Literal["approve", "refuse", "summarize"]


@dataclass(frozen=True, slots=True)
class Declares:
    """A tool's declarations (every one optional; the defaults declare nothing).

    Arguments:
    - `url_args`: arguments holding URLs the tool fetches or posts to (checked against egress).
    - `risk_free_args`: after taint, arguments exempt from the origin check (payload the user asked
      to be derived from what was read: subject, body). `guarded_args`: the older inverse (the
      arguments that are checked).
    - `writes_path`: the argument naming the workspace file the tool writes.
    - `executes`: the tool runs commands (asks after files were written from others' content).
    - `staged`: its effects land in the run's staged copy of the workspace (reviewed as a whole).
    - `secret_sink`: it takes secrets by design (a login), so secret values in its arguments are allowed.
    - `sends_to`: who reads what a call sends (tether.values._readers): `"user"` (the user's own
      file or note), `"public"` (a channel, a web page, a URL), or the arguments naming the
      recipients (`("recipients", "cc", "bcc")`). Undeclared: a URL argument is public, a written
      path the user's, a read sends nothing, any other effect goes where its arguments say.
    - `on_leak`: `"approve"` (default) asks a person before a value goes to someone outside its
      readers; `"refuse"` refuses the call.
    - `code_args`: arguments that are code (a shell command): a hidden value's handle is never put into
      them (tether.values); a call whose code names a handle of the run is refused, to pass it as data.

    Output:
    - `source`: where its output comes from (`"web"`, `"email"`, `"mcp"`, ...; an untrusted source
      taints the run, see `SafetyPolicy(untrusted_sources=...)`).
    - `private_output`: its output is the user's private data (it may not reach others).
    - `secret_output`: every value of its output is a secret (kept out of arguments and the answer).
    - `output_readers`: who may read its output: `"public"`, `"user"`, `"secret"`, or the output's
      fields naming its readers besides the user (`("sender", "recipients", "cc", "bcc")`: each
      e-mail readable by the user and its correspondents). Undeclared: `secret_output` is secret,
      `private_output` the user's, anything else public.
    - `exact_provenance`: its `ToolOutput.untrusted` says exactly whether each output is untrusted.
    - `trusted_fields`: the fields of an untrusted output's records that the service itself sets (a
      transaction's amount, a file's id), each with its shape (`{"id": "id", "amount": "number"}`; a list
      of names means shape `id` each): when the output is hidden, they are shown and carry a trusted
      label; the rest stays hidden (tether.values._fields, docs/hidden_values.md). A shape that does not
      exist is an `InvalidInput` here.

    The approval prompt: `describe(args)` a one-line description, `dry_run(args)` what the call would
    do (either may be async).

    Defaults of the tool's `Capability` when a policy derives it (`Capabilities(unlisted="inherit")`):
    `effect_of` (an effect class or a function of the arguments, e.g. a payment of 0 is reversible:
    the capability's `effect`), `ceilings`, `per_run`, `per_user`,
    `requires_approval`, `on_untrusted`, `authorize` (see `tether.policy.Capability`).
    """

    url_args: tuple[str, ...] = ()
    risk_free_args: tuple[str, ...] | None = None
    guarded_args: tuple[str, ...] | None = None
    writes_path: str | None = None
    executes: bool = False
    staged: bool = False
    secret_sink: bool = False
    sends_to: Literal["user", "public"] | tuple[str, ...] | None = None
    on_leak: Literal["approve", "refuse"] = "approve"
    code_args: tuple[str, ...] = ()
    source: str | None = None
    private_output: bool = False
    secret_output: bool = False
    output_readers: Literal["public", "user", "secret"] | tuple[str, ...] | None = None
    exact_provenance: bool = False
    trusted_fields: Mapping[str, str] | None = None
    describe: Callable[[dict[str, Any]], Any] | None = None
    dry_run: Callable[[dict[str, Any]], Any] | None = None
    effect_of: Effect | str | Callable[[dict[str, Any]], Effect | str] | None = None
    ceilings: Mapping[str, float] = field(default_factory=dict[str, float])
    per_run: int | None = None
    per_user: int | None = None
    requires_approval: bool = False
    on_untrusted: OnUntrusted = "approve"
    authorize: Callable[[str | None, dict[str, Any]], bool | str | None] | None = None

    def __post_init__(self) -> None:
        # a list of names is kept as a tuple; anything else (a lone string) is kept as it is, so the
        # policy refuses the tool's calls with a clear reason rather than guess
        for name in ("url_args", "risk_free_args", "guarded_args", "sends_to", "output_readers", "code_args"):
            value = getattr(self, name)
            if isinstance(value, (list, set, frozenset)):
                object.__setattr__(self, name, tuple(value))  # pyright: ignore[reportUnknownArgumentType]
        if self.trusted_fields is not None:
            # a shape that does not exist would show nothing, silently: refused here instead
            from tether.values._fields import checked_fields  # tether.values imports tether.tools

            object.__setattr__(self, "trusted_fields", checked_fields(self.trusted_fields))


class DeclaresKeywords(TypedDict, total=False):
    """`Declares`' fields as keywords of `@tool(...)`."""

    url_args: tuple[str, ...] | list[str]
    risk_free_args: tuple[str, ...] | list[str] | None
    guarded_args: tuple[str, ...] | list[str] | None
    writes_path: str | None
    executes: bool
    staged: bool
    secret_sink: bool
    sends_to: Literal["user", "public"] | tuple[str, ...] | list[str] | None
    on_leak: Literal["approve", "refuse"]
    code_args: tuple[str, ...] | list[str]
    source: str | None
    private_output: bool
    secret_output: bool
    output_readers: Literal["public", "user", "secret"] | tuple[str, ...] | list[str] | None
    exact_provenance: bool
    trusted_fields: Mapping[str, str] | tuple[str, ...] | list[str] | None
    describe: Callable[[dict[str, Any]], Any] | None
    dry_run: Callable[[dict[str, Any]], Any] | None
    effect_of: Effect | str | Callable[[dict[str, Any]], Effect | str] | None
    ceilings: Mapping[str, float]
    per_run: int | None
    per_user: int | None
    requires_approval: bool
    on_untrusted: OnUntrusted
    authorize: Callable[[str | None, dict[str, Any]], bool | str | None] | None


NO_DECLARATIONS = Declares()
# the deprecated metadata keys: every field (`effect` for `effect_of`), and `untrusted` (now
# `Tool.untrusted_output`)
_RENAMED = {"effect": "effect_of"}
LEGACY_KEYS = frozenset(f.name for f in dataclasses.fields(Declares)) - {"effect_of"} | {"effect", "untrusted"}


def legacy_keys(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The deprecated declaration keys a tool's metadata holds."""
    return {k: v for k, v in metadata.items() if k in LEGACY_KEYS}


def merge_legacy(name: str, base: Declares, legacy: Mapping[str, Any]) -> Declares:
    """`base` with the deprecated metadata keys of the same names applied (values kept as given, as
    the policy read them before), and a `DeprecationWarning` naming what to write instead. Keys that
    only repeat what `base` declares (kept for code that reads them, as the built-in tools do until
    the keys are removed) do not warn."""
    fields = {_RENAMED.get(k, k): v for k, v in legacy.items() if k != "untrusted"}
    merged = dataclasses.replace(base, **fields) if fields else base
    if merged == base and "untrusted" not in legacy:
        return base
    keys = ", ".join(sorted(legacy))
    first = _RENAMED.get(sorted(legacy)[0], sorted(legacy)[0])
    warnings.warn(f"tool '{name}': declarations in metadata ({keys}) are deprecated and are removed in tether "
                  f"{REMOVED_IN}; declare them with @tool({first}=...) or Tool(declares=Declares(...))",
                  DeprecationWarning, stacklevel=user_stacklevel())
    return merged

