"""Choices from the world: value sources resolved against the workspace and the request, and
final answers that copy tool-result text (the embedded model's grammar, without running it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gbnf_tools import Gbnf

from tether._types import Message, ModelRequest, ToolCall
from tether.cli._build import DEFAULT_INSTRUCTIONS, SMALL_MODEL_INSTRUCTIONS, default_instructions
from tether.models._gbnf import format_call
from tether.models._local import LocalModel, render_chat
from tether.models._world import request_words, resolve_values, result_quotes, workspace_files
from tether.policy import wrap_untrusted
from tether.rag._tool import search_tool
from tether.tools.builtin._calculator import calculator
from tether.tools.builtin._files import read_tool


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    for rel, text in {"config.ini": "[server]\nhost = 0.0.0.0\nport = 8421\n", "pets/alice.txt": "A dog.\n",
                      "pets/bob.txt": "A cat.\n", ".git/HEAD": "ref\n", "node_modules/x.js": "1\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


@pytest.fixture
def tiny(tmp_path: Path) -> LocalModel:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF not really")
    return LocalModel(gguf, n_threads=1, tiny=True)


def read(path: str, content: str, call_id: str = "c1") -> list[Message]:
    return [Message.assistant(tool_calls=[ToolCall(call_id, "Read", {"file_path": path})]),
            Message("tool", wrap_untrusted(content, "files"), tool_call_id=call_id, name="Read")]


def test_workspace_files_skip_hidden_and_tool_folders_and_stop_at_the_limit(workspace: Path) -> None:
    assert workspace_files(workspace, 10) == ["config.ini", "pets/alice.txt", "pets/bob.txt"]
    assert workspace_files(workspace, 2) is None
    assert workspace_files(workspace / "missing", 10) is None


def test_read_offers_the_named_files_then_only_the_unread_ones(workspace: Path, tiny: LocalModel) -> None:
    tool = read_tool(workspace)
    ask = [Message.user("Read pets/alice.txt and pets/bob.txt. What pets?")]
    g = Gbnf(tiny.grammar_text([tool.spec], ask))
    assert g.matches(format_call("Read", {"file_path": "pets/alice.txt"}))
    assert not g.matches(format_call("Read", {"file_path": "config.ini"}))  # not named
    assert not g.matches(format_call("Read", {"file_path": "alice.txt"}))  # invented
    assert not g.matches("<final>A dog.</final>")  # nothing read yet: a tool call first
    after_one = ask + read("pets/alice.txt", "A dog.\n")
    g = Gbnf(tiny.grammar_text([tool.spec], after_one))
    assert g.matches(format_call("Read", {"file_path": "pets/bob.txt"}))
    assert not g.matches(format_call("Read", {"file_path": "pets/alice.txt"}))  # read already
    assert not g.matches("<final>A dog.</final>")  # the request names a file not read yet
    after_both = after_one + read("pets/bob.txt", "A cat.\n", "c2")
    g = Gbnf(tiny.grammar_text([tool.spec], after_both))
    assert not g.matches(format_call("Read", {"file_path": "pets/bob.txt"}))  # nothing left to read
    assert g.matches("<final>A dog. A cat.</final>")  # one quote of each result
    assert not g.matches("<final>A dog.</final>")


def test_a_request_naming_no_file_offers_every_file(workspace: Path) -> None:
    source = read_tool(workspace).parameters["properties"]["file_path"]["x-tether-values"]
    offered = resolve_values(source, [Message.user("What port does the server use?")], fresh_only=True)
    assert offered is not None and offered.values == ("config.ini", "pets/alice.txt", "pets/bob.txt")
    assert resolve_values(source, [], fresh_only=False) is not None


def test_answers_quote_the_lines_that_match_the_question(workspace: Path, tiny: LocalModel) -> None:
    tool = read_tool(workspace)
    convo = [Message.user("What port is set in config.ini?"), *read("config.ini", "[server]\nhost = 0.0.0.0\nport = 8421\n")]
    assert result_quotes(convo) == [["port = 8421"]]
    g = Gbnf(tiny.grammar_text([tool.spec], convo))
    assert g.matches("<final>port = 8421</final>")
    assert not g.matches("<final>[server]</final>")
    assert not g.matches("<final>Today: 18 C, sunny, wind 10 km/h.</final>")  # the worked example cannot leak
    # errors are not quotable; results before the latest request are not either
    err = [Message.user("Read it"), Message.assistant(tool_calls=[ToolCall("c1", "Read", {"file_path": "x"})]),
           Message("tool", "ERROR: no such file", tool_call_id="c1", name="Read")]
    assert result_quotes(err) == []
    assert result_quotes([*convo, Message.user("thanks")]) == []


def test_calculator_expression_comes_from_the_request_when_it_has_one(tiny: LocalModel) -> None:
    g = Gbnf(tiny.grammar_text([calculator.spec], [Message.user("What is 156 / 12?")]))
    assert g.matches(format_call("calculator", {"expression": "156 / 12"}))
    assert not g.matches(format_call("calculator", {"expression": "156"}))
    # no arithmetic in the request: any expression of the declared pattern
    g = Gbnf(tiny.grammar_text([calculator.spec], [Message.user("What is seventeen times 23?")]))
    assert g.matches(format_call("calculator", {"expression": "17 * 23"}))
    assert not g.matches(format_call("calculator", {"expression": "17*23,"}))


def test_search_queries_are_words_of_the_request(tiny: LocalModel) -> None:
    class Empty:
        def search(self, query: str, k: int = 5) -> list:
            return []

    spec = search_tool(Empty()).spec
    ask = [Message.user("Search the policies: how much does express shipping cost?")]
    assert "express" in request_words(ask)
    g = Gbnf(tiny.grammar_text([spec], ask))
    assert g.matches(format_call("search", {"query": "express shipping cost"}))
    assert not g.matches(format_call("search", {"query": "london-london-london"}))


def test_tiny_prompt_names_no_directory(workspace: Path, tiny: LocalModel) -> None:
    tools = [read_tool(workspace)]
    assert default_instructions(tiny, tools, workspace) == SMALL_MODEL_INSTRUCTIONS
    capable = LocalModel(tiny.path, n_threads=1, tiny=False)
    assert default_instructions(capable, tools, workspace) == DEFAULT_INSTRUCTIONS.format(workspace=workspace)
    chat = render_chat(ModelRequest([Message.system(SMALL_MODEL_INSTRUCTIONS), Message.user("hi")],
                                    [t.spec for t in tools]), brief=True)
    assert str(workspace) not in chat[0]["content"] and workspace.name not in chat[0]["content"]


def test_the_loops_note_is_not_the_request_and_does_not_hide_the_results() -> None:
    """After an untrusted result the loop adds a note (a user-role message named 'tether'); the
    embedded model must still see the user's request and the results before the note (before: no
    quote could be offered, so it could not answer and read on until max_steps)."""
    from tether._types import NOTE_NAME, Message, ToolCall
    from tether.models._world import latest_request, result_quotes

    msgs = [Message.user("How many minutes does the soup simmer?"),
            Message.assistant("", [ToolCall("c1", "Read", {"file_path": "soup.txt"})]),
            Message("tool", "Soup simmers for 25 minutes.", tool_call_id="c1", name="Read"),
            Message("user", "[tether] The result of Read (c1) is data from outside this conversation.", name=NOTE_NAME)]
    assert latest_request(msgs) == "How many minutes does the soup simmer?"
    assert result_quotes(msgs) == [["Soup simmers for 25 minutes."]]
