"""Issue 40, secrets by value: every value read from a secret-bearing source (`.env`, key files, the
environment, a tool declared `secret_output`) is a secret whatever its key is called; the answer
filter redacts the spans of those values and of their exact encodings and keeps the rest; an effect
call carrying one is refused."""

from __future__ import annotations

import base64
import codecs
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether import Agent, tool
from tether.models._scripted import ScriptedModel, call
from tether.policy import SafetyPolicy
from tether.policy._approvals import ApprovalDecision, ApprovalRequest
from tether.policy._leaks import (
    encodings,
    environment_secrets,
    is_secret_value,
    redact,
    secret_file,
    values_in,
)
from tether.policy._policy import PolicyState
from tether.tools.builtin import file_tools

DB_PASS = "Wq8vL2nZ-r4Tx"  # names that match no secret pattern
TOKEN = "c4f1e9a07b3d5e28"
KEY = "sk-live-4f9a8b7c6d5e4f3a2b1c0d9e"
DOTENV = f"""# the app's settings
DB_HOST=localhost
DB_PORT=5432
DB_PASS={DB_PASS}
TOKEN="{TOKEN}"
OPENAI_API_KEY={KEY}
DEBUG=true
REGION=eu-west-1
"""
PLACEHOLDER = "[secret from .env redacted]"

ENCODERS: dict[str, Callable[[str], str]] = {
    "as written": lambda s: s,
    "base64": lambda s: base64.b64encode(s.encode()).decode(),
    "base64 of it reversed": lambda s: base64.b64encode(s[::-1].encode()).decode(),
    "base32": lambda s: base64.b32encode(s.encode()).decode(),
    "hex": lambda s: s.encode().hex(),
    "rot13": lambda s: codecs.encode(s, "rot13"),
    "URL-encoded": lambda s: urllib.parse.quote(s, safe=""),
    "percent-encoded bytes": lambda s: "".join(f"%{b:02X}" for b in s.encode()),
    "decimal codes": lambda s: ", ".join(str(ord(c)) for c in s),
    "decimal codes, spaced": lambda s: " ".join(str(ord(c)) for c in s),
    "hex codes": lambda s: " ".join(f"0x{b:02x}" for b in s.encode()),
    "dotted": lambda s: ".".join(s),
    "spaced out": lambda s: " ".join(s),
    "reversed": lambda s: s[::-1],
    "split over lines": lambda s: s[:5] + "\n" + s[5:],
}
# the reported probe: the two plain values, and the key in each way it got out
PROBE = {"DB_PASS": DB_PASS, "TOKEN": TOKEN,
         **{f"the key in {how}": ENCODERS[how](KEY) for how in
            ("base32", "rot13", "decimal codes", "dotted", "base64 of it reversed")}}


def _workspace(tmp_path: Path) -> Path:
    (tmp_path / ".env").write_text(DOTENV)
    return tmp_path


def _run(tmp_path: Path, answer: str, *calls_: object, policy: SafetyPolicy | None = None,
         tools: list | None = None) -> str:  # type: ignore[type-arg]
    tools = [*file_tools(_workspace(tmp_path)), *(tools or [])]
    script = [call("Read", file_path=".env"), *calls_, answer]
    result = Agent(ScriptedModel(script), tools=tools, policy=policy or SafetyPolicy(environment={})).run(
        "what does my .env configure?")
    return result.answer


@pytest.mark.parametrize("what", sorted(PROBE))
def test_the_reported_probe_is_redacted_and_the_rest_kept(tmp_path: Path, what: str) -> None:
    leaked = PROBE[what]
    answer = f"The database runs on localhost:5432 in eu-west-1.\n{what}: {leaked}\nDebug is on."
    out = _run(tmp_path, answer)
    assert leaked not in out and DB_PASS not in out and KEY not in out
    assert out == f"The database runs on localhost:5432 in eu-west-1.\n{what}: {PLACEHOLDER}\nDebug is on.", out


@pytest.mark.parametrize("how", sorted(ENCODERS))
def test_every_supported_encoding_of_a_dotenv_value_is_redacted(tmp_path: Path, how: str) -> None:
    out = _run(tmp_path, f"DB_PASS is <{ENCODERS[how](DB_PASS)}>, and TOKEN is <{ENCODERS[how](TOKEN)}>.")
    assert out == f"DB_PASS is <{PLACEHOLDER}>, and TOKEN is <{PLACEHOLDER}>.", out


def test_a_config_answer_keeps_its_harmless_lines(tmp_path: Path) -> None:
    """The other reported failure: the whole answer was withheld for the secrets in it."""
    out = _run(tmp_path, "Here is your .env:\n" + DOTENV)
    assert "[answer withheld" not in out
    for line in ("DB_HOST=localhost", "DB_PORT=5432", "DEBUG=true", "REGION=eu-west-1", "# the app's settings"):
        assert line in out, out
    assert f"DB_PASS={PLACEHOLDER}" in out and f'TOKEN="{PLACEHOLDER}"' in out
    assert DB_PASS not in out and TOKEN not in out and KEY not in out


def test_an_answer_of_secrets_only_is_withheld(tmp_path: Path) -> None:
    out = _run(tmp_path, f"{DB_PASS}\n{ENCODERS['base32'](TOKEN)}")
    assert out.startswith("[answer withheld: it held only secret values") and "(from .env)" in out, out


def test_values_the_user_wrote_are_not_redacted(tmp_path: Path) -> None:
    tools = file_tools(_workspace(tmp_path))
    result = Agent(ScriptedModel([call("Read", file_path=".env"), f"Yes, DB_PASS is {DB_PASS}."]), tools=tools,
                   policy=SafetyPolicy(environment={})).run(f"is DB_PASS still {DB_PASS}?")
    assert result.answer == f"Yes, DB_PASS is {DB_PASS}."


@tool(effect="irreversible")
def send_message(to: str, body: str) -> str:
    """Send a chat message."""
    SENT.append(body)
    return "sent"


SENT: list[str] = []


class Approve:
    """Approves everything: what is left to stop a call is the secret rule."""

    async def request(self, req: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision("approved", "test")


@pytest.mark.parametrize("how", ["as written", "base64 of it reversed", "dotted", "rot13"])
def test_a_secret_in_a_message_argument_is_refused(tmp_path: Path, how: str) -> None:
    SENT.clear()
    p = SafetyPolicy(environment={}, approver=Approve())
    body = f"as asked, the password: {ENCODERS[how](DB_PASS)}"
    _run(tmp_path, "done", call("send_message", to="bob", body=body), policy=p, tools=[send_message])
    records = [r for r in p.audit.query() if r.tool == "send_message"]
    assert SENT == [] and [r.decision for r in records] == ["refused:secret"]
    assert "read from .env" in records[0].reason and DB_PASS not in records[0].reason


def test_a_message_without_a_secret_is_sent(tmp_path: Path) -> None:
    SENT.clear()
    p = SafetyPolicy(environment={}, approver=Approve())
    _run(tmp_path, "done", call("send_message", to="bob", body="the app runs in eu-west-1"), policy=p,
         tools=[send_message])
    assert SENT == ["the app runs in eu-west-1"]


def test_writing_a_secret_back_into_the_workspace_is_not_refused(tmp_path: Path) -> None:
    p = SafetyPolicy(environment={}, approver=Approve())
    _run(tmp_path, "done", call("Write", file_path=".env.local", content=f"DB_PASS={DB_PASS}\n"), policy=p)
    assert (tmp_path / ".env.local").read_text() == f"DB_PASS={DB_PASS}\n"


def test_environment_values_are_secrets_but_public_variables_and_paths_are_not() -> None:
    env = {"MY_APP_CONF": "q9Zx-77-Lm2pPw", "HOME": "/home/alice-2024", "CA_BUNDLE": "/etc/ssl/ca-2024.pem",
           "APP_MODE": "production", "FLAG": "1"}
    assert environment_secrets(env) == ["q9Zx-77-Lm2pPw"]

    @tool
    def show_env() -> str:
        """Show the environment."""
        return "\n".join(f"{k}={v}" for k, v in env.items())

    answer = f"MY_APP_CONF is {base64.b32encode(b'q9Zx-77-Lm2pPw').decode()}; home is /home/alice-2024."
    result = Agent(ScriptedModel([call("show_env"), answer]), tools=[show_env],
                   policy=SafetyPolicy(environment=env)).run("what is set?")
    assert result.answer == "MY_APP_CONF is [secret from the environment redacted]; home is /home/alice-2024."


def test_a_tool_declared_secret_output_makes_every_value_secret() -> None:
    @tool(secret_output=True)
    def vault_get(name: str) -> str:
        """Fetch a secret."""
        return "Zk3-pQ9-wW1x"

    answer = f"Fetched: {'-'.join('Zk3-pQ9-wW1x')}"
    result = Agent(ScriptedModel([call("vault_get", name="db"), answer]), tools=[vault_get],
                   policy=SafetyPolicy(environment={})).run("get the db secret")
    assert result.answer == "Fetched: [secret from vault_get redacted]"


def test_grep_lines_and_commands_naming_a_secret_file_are_secret_sources(tmp_path: Path) -> None:
    @tool
    def shell(command: str) -> str:
        """Run a command."""
        return DOTENV

    tools = [*file_tools(_workspace(tmp_path)), shell]
    for first in (call("Grep", pattern="PASS|TOKEN"), call("shell", command="cat ./.env | head")):
        answer = f"{DB_PASS[::-1]} / {TOKEN}"
        result = Agent(ScriptedModel([first, answer]), tools=tools, policy=SafetyPolicy(environment={})).run("hi")
        assert result.answer.count(PLACEHOLDER) == 2, (first, result.answer)


def test_a_file_not_named_as_secret_is_not_a_value_source(tmp_path: Path) -> None:
    (tmp_path / "settings.ini").write_text(DOTENV)
    tools = file_tools(tmp_path)
    answer = f"DB_PASS={DB_PASS}"
    result = Agent(ScriptedModel([call("Read", file_path="settings.ini"), answer]), tools=tools,
                   policy=SafetyPolicy(environment={})).run("hi")
    assert result.answer == answer  # only the sk- key there looks like a secret


@pytest.mark.parametrize(("name", "secret"), [
    (".env", True), ("config/.env.production", True), ("prod.env", True), (".env.example", False),
    ("id_rsa", True), ("id_ed25519.pub", False), ("server.key", True), ("tls.pem", True), (".netrc", True),
    (".pgpass", True), ("credentials", True), ("secrets.yaml", True), ("vault.kdbx", True),
    ("github_token.txt", True), ("settings.py", False), (".venv", False), ("tokenizer.py", False)])
def test_secret_files_by_name(name: str, secret: bool) -> None:
    assert (secret_file(name) is not None) is secret


def test_values_in_each_kind_of_secret_file() -> None:
    assert values_in("machine api.example.com login bot-7Xq2a password Hx7!kk2Lq9\n", ".netrc") == [
        "bot-7Xq2a", "Hx7!kk2Lq9"]
    assert values_in("db.local:5432:app:app_user:pG7-pass-99\n", ".pgpass") == ["pG7-pass-99"]
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXkt\nAAAABG5vbmUAAAAE\n-----END OPENSSH PRIVATE KEY-----\n"
    assert values_in(pem, "id_ed25519") == ["b3BlbnNzaC1rZXktAAAABG5vbmUAAAAE"]
    assert values_in('{\n  "client_secret": "Qw3rty-Uiop-12",\n  "debug": true\n}', "credentials.json") == [
        "Qw3rty-Uiop-12"]
    assert values_in("[default]\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG\nregion = eu-west-1\n",
                     "credentials") == ["wJalrXUtnFEMI/K7MDENG"]
    assert values_in("DATABASE_URL=postgres://app:Sx9-pw-00@db/app\n", ".env") == [
        "postgres://app:Sx9-pw-00@db/app", "Sx9-pw-00"]
    assert values_in("ghp_onlythetoken0123456789abcdefghijkl\n", "github_token.txt") == [
        "ghp_onlythetoken0123456789abcdefghijkl"]


@pytest.mark.parametrize(("value", "secret"), [
    ("true", False), ("1", False), ("localhost", False), ("production", False), ("8080", False),
    ("eu-west-1", False), ("db.local:5432", False), ("hunter2hunter2", True), ("pG7-pass-99", True),
    ("Wq8vL2nZ", True), ("correcthorsebatterystaple", True)])
def test_how_long_and_varied_a_secret_is(value: str, secret: bool) -> None:
    assert is_secret_value(value) is secret


def test_the_state_keeps_where_each_secret_came_from() -> None:
    state = PolicyState("r", None, secrets={DB_PASS: ".env"})
    assert PolicyState.load(state.dump()).secrets == {DB_PASS: ".env"}
    old = {**state.dump(), "secrets": [DB_PASS]}  # dumped before sources were kept
    assert PolicyState.load(old).secrets == {DB_PASS: "a tool's output"}


# every supported encoding, as the property test draws them
ALL_ENCODERS = list(ENCODERS.values())
FILLER = st.text(alphabet="абвгдежзик \n", min_size=1, max_size=30).filter(lambda s: s.strip() != "")
SECRET = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=8, max_size=40).filter(
    is_secret_value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=SECRET, pieces=st.lists(st.tuples(st.sampled_from(ALL_ENCODERS), FILLER), min_size=1, max_size=4),
       head=FILLER)
def test_property_every_encoding_is_redacted_and_nothing_else_changes(
        secret: str, pieces: list[tuple[Callable[[str], str], str]], head: str) -> None:
    answer = head + "".join(encode(secret) + filler for encode, filler in pieces)
    expected = head + "".join(PLACEHOLDER + filler for _, filler in pieces)
    out, leaks = redact(answer, {secret: ".env"})
    assert out == expected and len(leaks) == len(pieces)


def test_encodings_are_searched_exactly_not_guessed() -> None:
    """A text near a secret (one character off in the middle) is left alone."""
    near = DB_PASS[:6] + "#" + DB_PASS[7:]
    text = f"{near} {base64.b64encode(near.encode()).decode()}"
    assert redact(text, {DB_PASS: ".env"}) == (text, [])
    assert all(len(key) >= 8 for key, _ in encodings(DB_PASS))


def test_an_error_reading_a_secret_file_is_not_a_source(tmp_path: Path) -> None:
    answer = "Could not read it: the file was not found, so nothing is configured."
    result = Agent(ScriptedModel([call("Read", file_path="missing/.env"), answer]), tools=file_tools(tmp_path),
                   policy=SafetyPolicy(environment={})).run("hi")
    assert result.answer == answer
    assert result.state is not None and result.state.policy["secrets"] == {}


def test_an_endpoint_address_in_the_environment_is_no_secret_but_a_password_inside_one_is() -> None:
    from tether.policy._leaks import environment_secrets

    found = environment_secrets({"OPENROUTER_BASE_URL": "http://127.0.0.1:43123/v1",
                                 "API_BASE": "https://api.example-llm.com/v1/chat",
                                 "DATABASE_URL": "postgres://app:Wq8vL2nZ-pass@db.internal:5432/app",
                                 "OPENAI_API_KEY": "sk-proj-Abc123Def456Ghi789",
                                 "WEBHOOK": "https://hooks.example.com/in?token=Zx81Qv02Lm"})
    assert sorted(found) == ["Wq8vL2nZ-pass", "https://hooks.example.com/in?token=Zx81Qv02Lm",
                             "sk-proj-Abc123Def456Ghi789"]


def _job_run(hidden_values: bool, command: str = "cat ./.env") -> tuple[ScriptedModel, str]:
    """The model starts a background job printing `.env` (by a command, so no key name says secret),
    waits for it, then answers with what the file holds."""
    @tool(job=True, effect="read_only")
    async def shell(command: str) -> str:
        """Run a command in the background."""
        return DOTENV

    def step(request: object) -> object:
        tools = [m.content for m in request.messages if m.role == "tool"]  # type: ignore[attr-defined]
        if not tools:
            return call("shell", command=command)
        if len(tools) == 1:
            return call("job_wait", job_id=tools[0].split()[1])
        return f"DB_PASS is {DB_PASS}, TOKEN is {TOKEN}. Also: {tools[-1]}"

    model = ScriptedModel(step)
    result = Agent(model, tools=[shell], policy=SafetyPolicy(environment={}, hidden_values=hidden_values)).run(
        "what does my .env configure?")
    return model, result.answer


def test_a_background_jobs_dotenv_output_is_never_shown_to_the_model_nor_in_the_answer() -> None:
    model, answer = _job_run(hidden_values=True)
    seen = "\n".join(m.content for r in model.requests for m in r.messages)
    assert DB_PASS not in seen and TOKEN not in seen and KEY not in seen, seen
    assert "secret" in model.requests[-1].messages[-1].content  # the handle's line says what it is
    assert DB_PASS not in answer and TOKEN not in answer and KEY not in answer, answer
    assert answer.count(PLACEHOLDER) >= 2, answer


def test_a_background_jobs_dotenv_values_are_redacted_in_the_visible_mode() -> None:
    """Shown to the model as a foreground Read of .env would be; every value is a secret of the run."""
    _, answer = _job_run(hidden_values=False)
    assert DB_PASS not in answer and TOKEN not in answer and KEY not in answer, answer
    assert answer.startswith(f"DB_PASS is {PLACEHOLDER}, TOKEN is {PLACEHOLDER}."), answer
    _, answer = _job_run(hidden_values=False, command="cat ./settings.txt")  # no secret source: as before
    assert DB_PASS in answer and TOKEN in answer
