"""The README's Python examples run as written (the model endpoint is a local fake server)."""

from __future__ import annotations

import re
from pathlib import Path

from fake_openai_server import FakeOpenAIServer, chat_completion, tool_call

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
