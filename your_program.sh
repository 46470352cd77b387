#!/bin/sh
# Runs `tether` from this checkout, with no install step, the way the CodeCrafters
# "Build your own Claude Code" tester calls it (from its own working directory):
#
#   OPENROUTER_API_KEY=... OPENROUTER_BASE_URL=... ./your_program.sh -p "PROMPT"
#
# Only the final answer goes to stdout. With OPENROUTER_BASE_URL set and no --model, the model is
# anthropic/claude-haiku-4.5. --yes auto-approves tool calls, as the tester's bypassPermissions
# setting does; the tools (Read, Write, Edit, Glob, Grep, Bash) work in the current directory.
#
# Python starts with -P (and PYTHONPATH keeps only absolute entries), so the working directory, which
# the agent writes, is never on sys.path: a json.py or socket.py written there is not imported.
set -e
here="$(cd "$(dirname "$0")" && pwd)"
absolute_only="$(printf '%s' "${PYTHONPATH:-}" | tr ':' '\n' | grep '^/' | paste -sd: - || true)"
export PYTHONPATH="$here/src${absolute_only:+:$absolute_only}"
if [ -x "$here/.venv/bin/python" ]; then
  exec "$here/.venv/bin/python" -P -m tether.cli --yes "$@"
elif command -v uv >/dev/null 2>&1 && [ -f "$here/pyproject.toml" ]; then
  exec uv run --quiet --project "$here" python -P -m tether.cli --yes "$@"
elif ! command -v python3 >/dev/null 2>&1; then
  echo "your_program.sh: no Python found; set up with: python3 -m venv $here/.venv && $here/.venv/bin/pip install -e $here (or install uv)" >&2
  exit 1
elif ! python3 -P -c 'import openai, pydantic, rich, typer' >/dev/null 2>&1; then
  echo "your_program.sh: tether is not set up in $here; run: python3 -m venv $here/.venv && $here/.venv/bin/pip install -e $here (or install uv)" >&2
  exit 1
else
  exec python3 -P -m tether.cli --yes "$@"
fi
