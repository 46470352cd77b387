"""llama.cpp's own GBNF engine, asked directly: does a grammar parse, does it accept a text.

`LlamaGrammar.from_string` in llama-cpp-python 0.3 only stores the text; a grammar that does not
parse surfaces later as a NULL sampler. `check_grammar` parses it up front (so a bad grammar is
a clear error), and `accepts` walks a text token by token through llama.cpp's grammar sampler,
which is how tests check that every string the builder means to allow is allowed by the engine
that will actually constrain decoding.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
from collections.abc import Iterator
from typing import Any

from tether._errors import InvalidInput


def _vocab(llama: Any) -> Any:
    return llama._model.vocab  # llama-cpp-python 0.3: the model's llama_vocab pointer


@contextlib.contextmanager
def _sampler(llama_cpp: Any, llama: Any, grammar: str) -> Iterator[Any]:
    sampler = llama_cpp.llama_sampler_init_grammar(_vocab(llama), grammar.encode("utf-8"), b"root")
    if not sampler:
        raise InvalidInput("llama.cpp could not parse the grammar")
    try:
        yield sampler
    finally:
        llama_cpp.llama_sampler_free(sampler)


def check_grammar(llama_cpp: Any, llama: Any, grammar: str) -> None:
    """Raise ValueError when llama.cpp cannot parse `grammar`."""
    with _sampler(llama_cpp, llama, grammar):
        pass


def _allowed(llama_cpp: Any, sampler: Any, token: int) -> bool:
    data = (llama_cpp.llama_token_data * 1)()
    data[0].id, data[0].logit, data[0].p = token, 0.0, 0.0
    array = llama_cpp.llama_token_data_array(data, 1, -1, False)
    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
    return not math.isinf(data[0].logit)


def accepts(llama_cpp: Any, llama: Any, grammar: str, text: str) -> bool:
    """True when llama.cpp's grammar sampler lets `text` through completely and then lets it end."""
    tokens = llama.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    if llama.detokenize(tokens).decode("utf-8", errors="replace") != text:
        raise InvalidInput(f"{text!r} does not round-trip through the tokenizer")
    eos = llama_cpp.llama_vocab_eos(_vocab(llama))
    with _sampler(llama_cpp, llama, grammar) as sampler:
        for token in tokens:
            if not _allowed(llama_cpp, sampler, token):
                return False
            llama_cpp.llama_sampler_accept(sampler, token)
        return _allowed(llama_cpp, sampler, eos)
