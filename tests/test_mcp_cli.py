"""`tether -p ... --mcp CONFIG` and `tether mcp-tools` as real processes, plus the config format."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mcp_types as mt
import pytest
from fake_openai_server import FakeOpenAIServer, chat_completion, tool_call
from hang import HANG
from mcp_servers.servers import env, flaky, npm_server

from tether._types import Effect
from tether.mcp import MCPConfigError, load_config, parse_config
from tether.mcp._config import DEFAULT_CALL_TIMEOUT
from tether.mcp._convert import effect_of, result_text


def tether(args: list[str], cwd: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tether", *args], cwd=cwd, env=env(**extra_env),
                          capture_output=True, text=True, timeout=HANG)


def write_config(path: Path, servers: dict[str, object]) -> Path:
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def test_print_mode_with_mcp_servers(tmp_path: Path) -> None:
    config = write_config(tmp_path / "mcp.json", {
        "ev": {"command": npm_server("mcp-server-everything"), "tether": {"connectTimeout": 60}},
        "broken": flaky("crash-at-start", connectTimeout=60)})
    script = [chat_completion(None, [tool_call("ev__get-sum", {"a": 20, "b": 22})]), chat_completion("42")]
    with FakeOpenAIServer(script) as model:
        proc = tether(["-p", "What is 20 + 22? Use the sum tool.", "--tools", "calculator", "--mcp", str(config)],
                      tmp_path, OPENROUTER_API_KEY="sk-test", OPENROUTER_BASE_URL=model.base_url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "42\n"
    # the server that could not start is named on stderr, the run goes on without it
    assert "mcp: MCP server 'broken' failed to start" in proc.stderr and "missing FLAKY_TOKEN" in proc.stderr
    first, second = (r.body for r in model.requests)
    names = {t["function"]["name"] for t in first["tools"]}
    assert {"calculator", "ev__get-sum", "ev__echo", "inspect_value"} <= names
    tool_messages = [m for m in second["messages"] if m["role"] == "tool"]
    # an MCP output not declared trusted is a hidden value (docs/hidden_values.md): the model gets a handle
    assert tool_messages[-1]["content"].startswith("$v1_1: output of ev__get-sum(a=20, b=22), 27 characters")
    assert "42" not in tool_messages[-1]["content"]


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "is not valid JSON"),
    ('{"mcpServers": {"x": {"command": "a", "url": "http://h"}}}', "needs exactly one of 'command'"),
    ('{"mcpServers": {"x": {"command": "a", "tether": {"trust": true}}}}', "unknown 'tether' setting 'trust'"),
])
def test_a_bad_config_is_one_error_line(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "mcp.json").write_text(content)
    proc = tether(["-p", "hi", "--mcp", "mcp.json", "--model", "openai:x", "--api-key", "k"], tmp_path)
    assert proc.returncode == 1
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_mcp_tools_lists_effects_trust_and_hints(tmp_path: Path) -> None:
    config = write_config(tmp_path / "mcp.json", {"ok": flaky("ok", connectTimeout=60, trustAnnotations=["echo"])})
    proc = tether(["mcp-tools", str(config)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in proc.stdout.splitlines()}
    assert rows["ok__echo"][:2] == ["read_only", "untrusted output"]
    assert "readOnlyHint=True" in rows["ok__echo"][2]
    assert rows["ok__crash"][:2] == ["irreversible", "untrusted output"]


def test_config_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FS_TOKEN", "t0k")
    servers = parse_config({"mcpServers": {
        "fs": {"command": "npx", "args": ["-y", "pkg"], "env": {"TOKEN": "${FS_TOKEN}"}},
        "web": {"type": "http", "url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"},
                "tether": {"prefix": "", "callTimeout": 5}},
        "off": {"command": "x", "disabled": True}}})
    fs, web = servers
    assert (fs.transport, fs.args, fs.env) == ("stdio", ("-y", "pkg"), {"TOKEN": "t0k"})
    assert fs.tether.call_timeout == DEFAULT_CALL_TIMEOUT
    assert (web.transport, web.headers, web.tether.call_timeout) == ("http", {"Authorization": "Bearer x"}, 5.0)
    assert fs.tool_name("read file.v2") == "fs__read_file_v2" and web.tool_name("search") == "search"
    assert parse_config({"servers": {"a": {"command": "b"}}})[0].name == "a"  # VS Code's spelling
    with pytest.raises(MCPConfigError, match="cannot read the MCP config"):
        load_config(tmp_path / "missing.json")
    for bad, why in [([], "must be a JSON object"), ({"mcpServers": []}, "needs an 'mcpServers' object"),
                     ({"mcpServers": {"a": {"command": "b", "args": "c"}}}, "'args' must be a list"),
                     ({"mcpServers": {"a": {"url": "ftp://x"}}}, "'url' must be an http"),
                     ({"mcpServers": {"a": {"command": "b", "tether": {"effects": {"t": "safe"}}}}}, "effect 'safe'"),
                     ({"mcpServers": {"a": {"command": "b", "tether": {"callTimeout": 0}}}}, "between 0 and 86400"),
                     ({"mcpServers": {"a": {"command": "b", "type": "sse"}}}, "'sse' is not supported")]:
        with pytest.raises(MCPConfigError, match=why):
            parse_config(bad)


def test_hints_count_only_when_confirmed() -> None:
    def tool(**hints: bool) -> mt.Tool:
        return mt.Tool(name="t", input_schema={"type": "object"}, annotations=mt.ToolAnnotations(**hints))

    plain, confirmed = (parse_config({"mcpServers": {"s": {"command": "c", "tether": t}}})[0]
                        for t in ({}, {"trustAnnotations": ["t"]}))
    assert effect_of(plain, tool(read_only_hint=True)) is Effect.IRREVERSIBLE
    assert effect_of(confirmed, tool(read_only_hint=True)) is Effect.READ_ONLY
    assert effect_of(confirmed, tool(read_only_hint=False, destructive_hint=False)) is Effect.REVERSIBLE
    assert effect_of(confirmed, tool(read_only_hint=False)) is Effect.IRREVERSIBLE  # destructive by default
    assert effect_of(confirmed, mt.Tool(name="t", input_schema={"type": "object"})) is Effect.IRREVERSIBLE


def test_result_text() -> None:
    result = mt.CallToolResult(content=[
        mt.TextContent(text="hello"), mt.ImageContent(data="aGVsbG8h", mime_type="image/png"),
        mt.EmbeddedResource(resource=mt.TextResourceContents(uri="file:///a.txt", text="body")),
        mt.ResourceLink(uri="file:///b", name="b")])
    assert result_text(result) == ("hello\n[image image/png, 6 bytes, not shown]\n[resource file:///a.txt]\nbody\n"
                                   "[resource link file:///b: b]")
    structured = mt.CallToolResult(content=[], structured_content={"temp": 21})
    assert result_text(structured) == '{"temp": 21}'


def test_chat_keeps_one_session_across_turns(tmp_path: Path) -> None:
    # pid changes nothing: declared so, it runs in the second turn too (undeclared, it would be an
    # effect of unknown kind); its output is declared trusted, so the model sees the pid (not a handle)
    config = write_config(tmp_path / "mcp.json", {"ok": flaky("ok", connectTimeout=60, effects={"pid": "read_only"},
                                                              trustedOutput=["pid"])})
    script = [chat_completion(None, [tool_call("ok__pid", {})]), chat_completion("first"),
              chat_completion(None, [tool_call("ok__pid", {}, id="call_2")]), chat_completion("second")]
    with FakeOpenAIServer(script) as model:
        proc = subprocess.run([sys.executable, "-m", "tether", "chat", "--tools", "none", "--mcp", str(config)],
                              cwd=tmp_path, input="one\ntwo\n", capture_output=True, text=True, timeout=HANG,
                              env=env(OPENROUTER_API_KEY="sk-test", OPENROUTER_BASE_URL=model.base_url))
    assert (proc.returncode, proc.stdout) == (0, "first\nsecond\n"), proc.stderr
    # the last tool message
    pids = [[m for m in r.body["messages"] if m["role"] == "tool"][-1]["content"].strip().split("\n")[0]
            for r in model.requests[1::2]]
    assert len(pids) == 2 and pids[0].isdigit() and pids[0] == pids[1]  # the same server process served both


def test_a_tool_left_out_by_its_declaration_is_one_stderr_line_of_the_run(tmp_path: Path) -> None:
    """`tether --mcp`: a declaration naming an argument the tool lacks leaves the tool out, and says so once
    on stderr (not only in `tether mcp-tools`); the run goes on with the other tools."""
    config = write_config(tmp_path / "mcp.json", {
        "ok": flaky("ok", connectTimeout=60, declare={"echo": {"codeArgs": ["command"]}})})
    with FakeOpenAIServer([chat_completion("done")]) as model:
        proc = tether(["-p", "hi", "--tools", "none", "--mcp", str(config)], tmp_path,
                      OPENROUTER_API_KEY="sk-test", OPENROUTER_BASE_URL=model.base_url)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "left out" in line]
    assert lines == ["mcp: tool 'echo' of server 'ok' is left out: its declared code_args names 'command', "
                     "not among its arguments (text)"], proc.stderr
    names = {t["function"]["name"] for t in model.requests[0].body["tools"]}
    assert "ok__echo" not in names and "ok__hang" in names
