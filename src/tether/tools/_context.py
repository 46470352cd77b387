"""`ToolContext`: the per-call facts the executor hands a tool that asks for them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ToolContext:
    """Per-call facts a tool may ask for by annotating a parameter with this type."""

    run_id: str
    call_id: str
    user: str | None = None
    idempotency_key: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
