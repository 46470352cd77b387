"""The `tether` command line (typer + rich). `main` is the console-script entry point."""

from tether.cli._app import app, main

__all__ = ["app", "main"]
