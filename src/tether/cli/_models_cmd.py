"""`tether models`: which models this machine can use, without loading or calling any.

Plain lines (one fact each, never wrapped) so the output reads the same in a terminal and a pipe.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from rich.console import Console

from tether._terminal import clean
from tether.cli._build import CliError, model_deadline, run_seconds
from tether.cli._options import RunOptions
from tether.models._resolve import configured_endpoints, default_choice, gguf_files, local_status, models_dir
from tether.tools._sandbox import INSTALL_HINT, probe_bubblewrap


def _limit(read: Callable[[RunOptions, Mapping[str, str]], float | None], opts: RunOptions,
           env: Mapping[str, str]) -> str:
    try:
        seconds = read(opts, env)
    except CliError as exc:
        return f"invalid ({exc}), so runs refuse to start;"
    return "no limit" if seconds is None else f"{seconds:g} s"


def limits_report(opts: RunOptions, env: Mapping[str, str]) -> list[str]:
    """The time limits a run would get, and whether Bash is sandboxed."""
    run, call = _limit(run_seconds, opts, env), _limit(model_deadline, opts, env)
    problem = probe_bubblewrap()
    sandbox = ("bubblewrap: only the workspace is writable, no network unless --allow-net" if problem is None
               else f"none ({problem}): every Bash call needs approval; {INSTALL_HINT}")
    return [
        "limits:",
        f"  run        {run} wall clock (--max-seconds, TETHER_MAX_SECONDS; 0: no limit)",
        f"  model call {call} in total per call, retries and streaming included "
        "(--model-timeout, TETHER_MODEL_TIMEOUT; 0: no limit)",
        f"Bash sandbox: {sandbox}",
    ]


def models_report(env: Mapping[str, str] | None = None, opts: RunOptions | None = None) -> list[str]:
    """The lines `tether models` prints. API keys are never shown, only whether one is set."""
    env = os.environ if env is None else env
    lines = ["endpoints configured in the environment:"]
    endpoints = configured_endpoints(env)
    for e in endpoints:
        spec = f"anthropic:{e.default_model}" if e.name == "anthropic" else e.default_model
        key = "key set" if e.key_set else "no key"
        lines.append(f"  {e.name:<10} {spec} at {e.base_url} ({key}; from {e.source})")
    if not endpoints:
        lines.append("  none (set OPENAI_API_KEY / OPENAI_BASE_URL, OPENROUTER_API_KEY or ANTHROPIC_API_KEY)")
    local = local_status()
    lines.append("embedded model:")
    lines.append(f"  local      {'available: ' if local.available else 'not installed: '}{local.detail}")
    lines.append(f"             measured (python -m bench.local_model): {_measured()}")
    root = models_dir(env)
    files = gguf_files(env)
    lines.append(f"GGUF files under {root} (TETHER_MODELS_DIR), usable as --model local:PATH:")
    lines += [f"  local:{path}" for path in files] or ["  none"]
    lines.append(f"default (no --model): {default_choice(env)}")
    lines += limits_report(opts or RunOptions(), env)
    return [clean(line) for line in lines]


def _measured() -> str:
    try:
        from tether.models._local import MEASURED
    except ImportError:
        return "unknown"
    return MEASURED


def show_models(console: Console, env: Mapping[str, str] | None = None, opts: RunOptions | None = None) -> None:
    for line in models_report(env, opts):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
