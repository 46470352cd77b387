"""MCP server configuration in the `mcpServers` JSON format other MCP clients use.

```json
{"mcpServers": {
  "fs":   {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/data"],
           "env": {"DEBUG": "0"},
           "tether": {"trustAnnotations": ["read_text_file", "list_directory"],
                      "effects": {"create_directory": "reversible"}, "trustedOutput": ["list_directory"],
                      "declare": {"run_script": {"codeArgs": ["source"]}}}},
  "docs": {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer ..."}}
}}
```

`command`/`args`/`env`/`cwd` start a server over stdio; `url` (with optional `headers`) talks
streamable HTTP. `disabled: true` skips a server. tether's own settings live under the `tether` key,
which other clients ignore; see `TetherSettings`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether._errors import InvalidInput, TetherError
from tether._types import Effect
from tether.values._fields import checked_fields

DEFAULT_CONNECT_TIMEOUT = 20.0
DEFAULT_CALL_TIMEOUT = 60.0
_NAME = re.compile(r"[^A-Za-z0-9_-]")


class MCPConfigError(TetherError, ValueError):
    """A configuration problem, described in one line for the user."""


@dataclass(slots=True, frozen=True)
class TetherSettings:
    """What tether adds to a server's entry (all optional).

    - `trustAnnotations`: true or a list of tool names whose MCP annotations (readOnlyHint,
      destructiveHint) the user confirms; only then do they set the effect class.
    - `effects`: tool name -> read_only | reversible | irreversible, set by the user (wins over hints).
    - `trustedOutput`: true or a list of tool names whose output is not untrusted content.
    - `tools`: only these tool names are offered (default: all the server lists).
    - `prefix`: what tether tool names start with (default: the server's name; "" for none).
    - `connectTimeout`, `callTimeout`: seconds (defaults 20 and 60).
    - `declare`: tool name -> what the user declares of it for the safety policy (`DECLARE_KEYS`:
      `codeArgs`, `urlArgs`, `sendsTo`, `outputReaders`, `hideOutput`, `untrusted`, `trustedFields`, ...), read as the
      tool's `Declares` (tether.tools); kept here with their `Declares` names.
    """

    trust_annotations: bool | frozenset[str] = False
    effects: dict[str, Effect] = field(default_factory=dict)
    trusted_output: bool | frozenset[str] = False
    tools: frozenset[str] | None = None
    prefix: str | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    call_timeout: float = DEFAULT_CALL_TIMEOUT
    declare: dict[str, dict[str, Any]] = field(default_factory=dict[str, dict[str, Any]])

    def annotations_confirmed(self, tool: str) -> bool:
        return self.trust_annotations is True or (
            isinstance(self.trust_annotations, frozenset) and tool in self.trust_annotations)

    def output_trusted(self, tool: str) -> bool:
        return self.trusted_output is True or (
            isinstance(self.trusted_output, frozenset) and tool in self.trusted_output)


@dataclass(slots=True, frozen=True)
class ServerConfig:
    """One MCP server: a command to start (stdio) or a URL (streamable HTTP)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    tether: TetherSettings = field(default_factory=TetherSettings)

    @property
    def transport(self) -> str:
        return "http" if self.url is not None else "stdio"

    def tool_name(self, mcp_name: str) -> str:
        """The tether name of one of this server's tools: `prefix__name`, safe for every provider."""
        prefix = self.name if self.tether.prefix is None else self.tether.prefix
        full = f"{prefix}__{mcp_name}" if prefix else mcp_name
        return _NAME.sub("_", full)[:64]


def load_config(path: str | Path) -> list[ServerConfig]:
    """The enabled servers of an `mcpServers` file. Raises MCPConfigError with one line on bad input."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise MCPConfigError(f"cannot read the MCP config {p}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MCPConfigError(f"the MCP config {p} is not valid JSON: {exc.msg} at line {exc.lineno}") from exc
    try:
        return parse_config(data)
    except MCPConfigError as exc:
        raise MCPConfigError(f"{p}: {exc}") from exc


def parse_config(data: Any) -> list[ServerConfig]:
    """Servers from the parsed JSON (`{"mcpServers": {...}}`; `servers` as VS Code spells it)."""
    if not isinstance(data, dict):
        raise MCPConfigError("the MCP config must be a JSON object with an 'mcpServers' object")
    servers = data.get("mcpServers", data.get("servers"))
    if not isinstance(servers, dict):
        raise MCPConfigError("the MCP config needs an 'mcpServers' object mapping names to servers")
    return [_server(name, entry) for name, entry in servers.items()
            if not (isinstance(entry, dict) and entry.get("disabled") is True)]


def _server(name: str, entry: Any) -> ServerConfig:
    where = f"server {name!r}"
    if not name or not isinstance(entry, dict):
        raise MCPConfigError(f"{where} must be an object with 'command' or 'url'")
    command, url = entry.get("command"), entry.get("url", entry.get("serverUrl"))
    if (command is None) == (url is None):
        raise MCPConfigError(f"{where} needs exactly one of 'command' (stdio) or 'url' (streamable HTTP)")
    kind = entry.get("type", entry.get("transport"))
    if kind is not None and kind not in ("stdio", "http", "streamable-http", "streamableHttp", "streamable_http"):
        raise MCPConfigError(f"{where}: transport type {kind!r} is not supported (use stdio or http)")
    if command is not None:
        _check(isinstance(command, str) and command.strip() != "", f"{where}: 'command' must be a non-empty string")
    if url is not None:
        _check(isinstance(url, str) and url.startswith(("http://", "https://")),
               f"{where}: 'url' must be an http:// or https:// URL")
    args = entry.get("args", [])
    _check(isinstance(args, list) and all(isinstance(a, str) for a in args), f"{where}: 'args' must be a list of strings")
    env = _str_map(entry.get("env"), f"{where}: 'env'")
    headers = _str_map(entry.get("headers"), f"{where}: 'headers'") or {}
    cwd = entry.get("cwd")
    _check(cwd is None or isinstance(cwd, str), f"{where}: 'cwd' must be a string")
    return ServerConfig(
        name=name, command=command, args=tuple(args),
        env={k: os.path.expandvars(v) for k, v in env.items()} if env is not None else None,
        cwd=os.path.expanduser(cwd) if cwd else None, url=url,
        headers={k: os.path.expandvars(v) for k, v in headers.items()},
        tether=_settings(entry.get("tether", {}), where),
    )


def _settings(raw: Any, where: str) -> TetherSettings:
    if not isinstance(raw, dict):
        raise MCPConfigError(f"{where}: 'tether' must be an object")
    known = {"trustAnnotations", "effects", "trustedOutput", "tools", "prefix", "connectTimeout", "callTimeout",
             "declare"}
    unknown = sorted(set(raw) - known)
    _check(not unknown, f"{where}: unknown 'tether' setting {', '.join(map(repr, unknown))}; "
           f"known: {', '.join(sorted(known))}")
    effects_raw = raw.get("effects", {})
    _check(isinstance(effects_raw, dict), f"{where}: 'tether.effects' must map tool names to effect classes")
    effects: dict[str, Effect] = {}
    for tool, value in effects_raw.items():
        try:
            effects[tool] = Effect(value)
        except ValueError:
            raise MCPConfigError(f"{where}: effect {value!r} for {tool!r} is not one of "
                                 f"{', '.join(e.value for e in Effect)}") from None
    tools = raw.get("tools")
    _check(tools is None or (isinstance(tools, list) and all(isinstance(t, str) for t in tools)),
           f"{where}: 'tether.tools' must be a list of tool names")
    prefix = raw.get("prefix")
    _check(prefix is None or isinstance(prefix, str), f"{where}: 'tether.prefix' must be a string")
    return TetherSettings(
        trust_annotations=_names_or_bool(raw.get("trustAnnotations", False), f"{where}: 'tether.trustAnnotations'"),
        effects=effects,
        trusted_output=_names_or_bool(raw.get("trustedOutput", False), f"{where}: 'tether.trustedOutput'"),
        tools=frozenset(tools) if tools is not None else None,
        prefix=prefix,
        connect_timeout=_seconds(raw.get("connectTimeout", DEFAULT_CONNECT_TIMEOUT), f"{where}: 'connectTimeout'"),
        call_timeout=_seconds(raw.get("callTimeout", DEFAULT_CALL_TIMEOUT), f"{where}: 'callTimeout'"),
        declare=_declare(raw.get("declare", {}), where),
    )


_NAMES = "a list of argument names"
# `tether.declare.TOOL` keys -> (the `Declares` field, or hide_output / untrusted, and what its value may be)
DECLARE_KEYS: dict[str, tuple[str, str]] = {
    "codeArgs": ("code_args", _NAMES), "urlArgs": ("url_args", _NAMES), "riskFreeArgs": ("risk_free_args", _NAMES),
    "guardedArgs": ("guarded_args", _NAMES), "writesPath": ("writes_path", "an argument name"),
    "executes": ("executes", "true or false"), "secretSink": ("secret_sink", "true or false"),
    "sendsTo": ("sends_to", '"user", "public" or ' + _NAMES), "onLeak": ("on_leak", '"approve" or "refuse"'),
    "outputReaders": ("output_readers", '"public", "user", "secret" or a list of output field names'),
    "privateOutput": ("private_output", "true or false"), "secretOutput": ("secret_output", "true or false"),
    "source": ("source", 'a source name such as "web", "email" or "mcp"'),
    "requiresApproval": ("requires_approval", "true or false"),
    "onUntrusted": ("on_untrusted", '"approve", "refuse" or "summarize"'),
    "hideOutput": ("hide_output", "true or false"), "untrusted": ("untrusted", "true or false"),
    "trustedFields": ("trusted_fields", 'an object of output field names to shapes, such as {"id": "id", '
                      '"amount": "number"}'),
}
_WORDS = {"sendsTo": ("user", "public"), "onLeak": ("approve", "refuse"), "outputReaders": ("public", "user", "secret"),
          "onUntrusted": ("approve", "refuse", "summarize")}


def _declare(raw: Any, where: str) -> dict[str, dict[str, Any]]:
    """The per-tool declarations, checked: each value of the kind its key takes (one error line if not)."""
    _check(isinstance(raw, dict), f"{where}: 'tether.declare' must map tool names to objects of declarations")
    out: dict[str, dict[str, Any]] = {}
    for tool, decl in raw.items():
        what = f"{where}: 'tether.declare.{tool}'"
        _check(isinstance(decl, dict), f"{what} must be an object such as {{\"codeArgs\": [\"command\"]}}")
        unknown = sorted(set(decl) - set(DECLARE_KEYS))
        _check(not unknown, f"{what}: unknown declaration {', '.join(map(repr, unknown))}; known: "
               f"{', '.join(sorted(DECLARE_KEYS))}")
        fields: dict[str, Any] = {}
        for key, value in decl.items():
            name, kind = DECLARE_KEYS[key]
            names = isinstance(value, list) and all(isinstance(v, str) and v for v in value)
            if kind == "true or false":
                ok = isinstance(value, bool)
            elif key in _WORDS:
                ok = value in _WORDS[key] or (names and key in ("sendsTo", "outputReaders"))
            elif key == "trustedFields":
                value = _trusted_fields(value, f"{what}.{key}")
                ok = True
            elif kind == _NAMES:
                ok = names
            else:
                ok = isinstance(value, str) and value != ""
            _check(ok, f"{what}.{key} must be {kind}")
            fields[name] = tuple(value) if isinstance(value, list) else value
        out[tool] = fields
    return out


def _trusted_fields(value: Any, what: str) -> dict[str, str]:
    """A `trustedFields` object checked as `Declares.trusted_fields` is (tether.values._fields), its error one line."""
    _check(isinstance(value, dict), f"{what} must be an object of output field names to shapes, such as "
           '{"id": "id", "amount": "number"}')
    try:
        return checked_fields(value)
    except InvalidInput as e:
        raise MCPConfigError(f"{what}: {str(e).removeprefix('trusted_fields: ')}") from None


def _names_or_bool(value: Any, what: str) -> bool | frozenset[str]:
    if isinstance(value, bool):
        return value
    _check(isinstance(value, list) and all(isinstance(v, str) for v in value), f"{what} must be true or a list of "
           "tool names")
    return frozenset(value)


def _seconds(value: Any, what: str) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 86_400
    _check(ok, f"{what} must be a number of seconds between 0 and 86400")
    return float(value)


def _str_map(value: Any, what: str) -> dict[str, str] | None:
    if value is None:
        return None
    _check(isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()),
           f"{what} must map strings to strings")
    return dict(value)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise MCPConfigError(message)
