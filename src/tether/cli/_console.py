"""The CLI's stderr console, its progress reporter, and the prompt as the user gave it."""

from __future__ import annotations

import sys

from rich.console import Console

from tether.cli import _options as o
from tether.cli._errors import CliError
from tether.cli._progress import Reporter


def err_console() -> Console:
    return Console(stderr=True, soft_wrap=True, highlight=False, emoji=False)


def reporter_for(opts: o.RunOptions, console: Console) -> Reporter:
    enabled = not opts.quiet and (opts.verbose or console.is_terminal)
    return Reporter(console, enabled=enabled, verbose=opts.verbose)


def read_prompt(prompt: str) -> str:
    if prompt == "-":
        try:
            prompt = sys.stdin.read()
            prompt.encode("utf-8")  # under a C locale undecodable bytes arrive as surrogates instead
        except (UnicodeDecodeError, UnicodeEncodeError) as exc:
            raise CliError(f"the prompt on stdin is not UTF-8 text ({exc.reason} at position {exc.start})") from None
    if not prompt.strip():
        raise CliError("the prompt is empty")
    return prompt.strip()
