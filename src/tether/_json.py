"""`dumps_fn`: `json.dumps` with fixed options, as a function built once for the per-step paths.

`json.dumps(value, **options)` builds a `JSONEncoder` and, per call, its closures; that Python set-up
costs more than encoding a small argument dict. The function returned here runs the same C encoder
`JSONEncoder.encode` uses (a fresh one per call, so the circular-reference check stays per call and
the function is safe across threads), and so returns exactly the text `json.dumps` would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

try:
    from json.encoder import c_make_encoder as _c_make_encoder  # pyright: ignore[reportAttributeAccessIssue]
except ImportError:  # pragma: no cover - CPython always has the C accelerator
    _c_make_encoder = None


def dumps_fn(*, ensure_ascii: bool = True, sort_keys: bool = False,
             separators: tuple[str, str] = (", ", ": ")) -> Callable[[Any], str]:
    """`lambda value: json.dumps(value, default=str, ensure_ascii=..., sort_keys=..., separators=...)`."""
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, sort_keys=sort_keys, separators=separators, default=str)
    if _c_make_encoder is None:  # pragma: no cover
        return encoder.encode
    make = _c_make_encoder
    escape = json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
    item_sep, key_sep = separators

    def dumps(value: Any) -> str:
        if isinstance(value, (dict, list)):
            return "".join(make({}, str, escape, None, key_sep, item_sep, sort_keys, False, True)(value, 0))
        return encoder.encode(value)  # str and scalars: encode's own fast paths

    return dumps
