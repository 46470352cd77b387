"""The options shared by `tether -p`, `tether run` and `tether chat`, declared once.

The root command and each subcommand take the same options, so `tether --model X chat` and
`tether chat --model X` both work; `RunOptions.merge` lets the subcommand's values win.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

TOOL_SETS = ("coding", "calculator", "files", "bash", "none")

Model = Annotated[str | None, typer.Option(
    "--model", "-m", help="openai:NAME, openrouter:NAME, anthropic:NAME, local, local:/path/model.gguf, or a "
    "bare NAME for the configured endpoint. Default: $TETHER_MODEL, then OPENAI_*, OPENROUTER_*, the "
    "embedded model.", show_default=False)]
BaseUrl = Annotated[str | None, typer.Option("--base-url", help="OpenAI-compatible base URL (e.g. "
                                             "http://localhost:11434/v1).", show_default=False)]
ApiKey = Annotated[str | None, typer.Option("--api-key", help="API key for the endpoint (default: from the "
                                            "environment).", show_default=False)]
MaxSteps = Annotated[int | None, typer.Option("--max-steps", min=1, help="Model calls per run. Default: 60.",
                                              show_default=False)]
MaxTokens = Annotated[int | None, typer.Option("--max-tokens", min=1, help="Total tokens per run.",
                                               show_default=False)]
MaxSeconds = Annotated[float | None, typer.Option(
    "--max-seconds", min=0.0, help="Wall-clock seconds per run; 0: no limit. Default: $TETHER_MAX_SECONDS, "
    "then 600.", show_default=False)]
ModelTimeout = Annotated[float | None, typer.Option(
    "--model-timeout", min=0.0, help="Total seconds one model call may take, retries and streaming included "
    "(not a per-read timeout); 0: no limit. Default: $TETHER_MODEL_TIMEOUT, then 120.", show_default=False)]
MaxCost = Annotated[float | None, typer.Option("--max-cost", min=0.0, help="Cost per run in USD.",
                                               show_default=False)]
Tools = Annotated[str | None, typer.Option(
    "--tools", "-t", help="Comma list from: coding (Read, Write, Edit, Glob, Grep, Bash), calculator, files "
    "(Read, Write, Edit, Glob, Grep), bash, none, or your own as module:name (a Tool, a typed function or a list "
    "of them). Default: coding.", show_default=False)]
Workspace = Annotated[Path | None, typer.Option(
    "--workspace", "-w", help="Directory the file tools and Bash work in. Default: the current directory.",
    show_default=False, file_okay=False)]
Json = Annotated[bool, typer.Option("--json", help="Print the whole RunResult as JSON on stdout.")]
Trace = Annotated[Path | None, typer.Option("--trace", help="Write every trace event to FILE, one JSON line each.",
                                            show_default=False, dir_okay=False)]
TextProtocol = Annotated[str | None, typer.Option(
    "--text-protocol", help="Give a raw model tools through a text protocol: tagged or react.",
    show_default=False)]
Instructions = Annotated[str | None, typer.Option(
    "--instructions", help="System instructions (default: a short coding-agent prompt naming the workspace).",
    show_default=False)]
OutputSchema = Annotated[Path | None, typer.Option(
    "--output-schema", help="JSON Schema FILE the answer must match; stdout gets the validated JSON.",
    show_default=False, dir_okay=False)]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Approve every tool call that asks for approval.")]
AllowNet = Annotated[bool, typer.Option("--allow-net", help="Let Bash commands use the network (the sandbox "
                                        "has none by default).")]
Env = Annotated[list[str] | None, typer.Option(
    "--env", help="Pass the environment variable NAME to Bash commands (repeat for more). Only PATH, the "
    "locale and TERM are passed otherwise, with a private HOME and TMPDIR.", metavar="NAME", show_default=False)]
Protect = Annotated[list[str] | None, typer.Option(
    "--protect", help="Keep this workspace PATH read-only for Bash, like .git: a file that runs code later, "
    "outside the sandbox (e.g. .envrc, .vscode). Repeat for more.", metavar="PATH", show_default=False)]
SandboxRead = Annotated[list[Path] | None, typer.Option(
    "--sandbox-read", help="Let Bash commands read this PATH (read-only): a toolchain outside /usr, e.g. "
    "/opt/node or ~/.cargo. The sandbox shows only the workspace, /usr and the system's libraries, parts of "
    "/etc and tether's Python otherwise. Repeat for more; also $TETHER_SANDBOX_READ (PATH:PATH).",
    metavar="PATH", show_default=False, exists=True)]
Raw = Annotated[bool, typer.Option("--raw", help="Print the answer exactly as the model wrote it, terminal "
                                   "control sequences included (they are removed by default).")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Show progress and usage on stderr even when it "
                                       "is not a terminal.")]
Mcp = Annotated[Path | None, typer.Option(
    "--mcp", help="An mcpServers JSON file (the format of Claude Desktop and Cursor): its servers' tools join "
    "the run. See docs/mcp.md.", show_default=False, dir_okay=False)]
Compact = Annotated[bool, typer.Option(
    "--compact", help="Fold old turns into a recorded summary when the context passes 60% of the model's "
    "window, and give the model task-state tools (docs/context.md).")]
Plan = Annotated[bool, typer.Option(
    "--plan", help="Plan mode: the model writes the whole plan as a program before any tool runs; tether runs it "
    "with every value's sources tracked, reading untrusted text only through a tool-free reader "
    "(docs/plan-mode.md). Needs a model that writes code. With `run --durable` its steps are checkpointed and "
    "its questions park the run for `tether approve`.")]
NoStage = Annotated[bool, typer.Option(
    "--no-stage", help="Write the workspace directly instead of a staged copy reviewed at the end (also "
    "TETHER_STAGE=off). Staged, file writes and sandboxed Bash need no approval.")]
Apply = Annotated[bool, typer.Option(
    "--apply", help="Apply the run's staged changes at its end without asking (not code that runs later: that "
    "stays staged; --yes applies everything).")]
Allow = Annotated[list[str] | None, typer.Option(
    "--allow", help="Approve calls matching RULE for this run without asking, e.g. 'Bash(pytest *)' or "
    "'Bash(git status)' (a shell-style pattern over the command). Repeat for more.", metavar="RULE",
    show_default=False)]
NoStore = Annotated[bool, typer.Option(
    "--no-store", help="Do not record this run in the run store (`tether runs`); TETHER_STORE=off does the same.")]
ShowOutputs = Annotated[bool, typer.Option(
    "--show-outputs", help="The visible mode: every tool output goes into the model's context as it is, none "
    "is hidden behind a handle (no inspect_value); after the first untrusted output every effect asks. By "
    "default untrusted web, mail and MCP outputs are hidden values (docs/hidden_values.md).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr, even on a terminal.")]
Strictness = Annotated[str | None, typer.Option(
    "--strictness", help="Screen each request (before any model call) and the final answer with tether's safety "
    "filter: off, lenient, standard or strict (docs/safety.md). A refused request or withheld answer exits 6. "
    "Default: $TETHER_STRICTNESS, then off.", show_default=False)]


@dataclass(slots=True)
class RunOptions:
    """Everything the options say; None means 'not given' so root and subcommand values can merge."""

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    max_steps: int | None = None
    max_tokens: int | None = None
    max_seconds: float | None = None
    model_timeout: float | None = None
    max_cost: float | None = None
    strictness: str | None = None
    tools: str | None = None
    workspace: Path | None = None
    json: bool = False
    trace: Path | None = None
    text_protocol: str | None = None
    instructions: str | None = None
    yes: bool = False
    allow_net: bool = False
    env: tuple[str, ...] | None = None
    protect: tuple[str, ...] | None = None
    sandbox_read: tuple[str, ...] | None = None
    raw: bool = False
    verbose: bool = False
    quiet: bool = False
    output_schema: Path | None = None
    mcp: Path | None = None
    compact: bool = False
    plan: bool = False
    no_stage: bool = False
    apply: bool = False
    allow: tuple[str, ...] | None = None
    no_store: bool = False
    show_outputs: bool = False

    def merge(self, other: RunOptions) -> RunOptions:
        """These options overridden by the ones given in `other` (flags: either one set)."""
        out = dataclasses.replace(self)
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, bool):
                setattr(out, f.name, mine or theirs)
            elif isinstance(mine, tuple) and isinstance(theirs, tuple):
                setattr(out, f.name, tuple(dict.fromkeys(mine + theirs)))
            elif theirs is not None:
                setattr(out, f.name, theirs)
        return out
