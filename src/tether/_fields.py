"""Default factories for dataclass fields that every type checker reads alike.

Stock pyright (strict) leaves `field(default_factory=list)`'s element type unknown; these return the
field's type with Any elements. A parametrised factory (`list[str]`) would too, at 8x the cost of a
plain call per instance, and messages and events are made on every step.
"""

from typing import Any


def new_list() -> list[Any]:
    return []


def new_dict() -> dict[str, Any]:
    return {}
