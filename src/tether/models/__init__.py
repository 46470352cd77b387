"""Model adapters behind one protocol. Imported lazily, so `import tether` stays light.

    from tether.models import OpenAICompatModel, ScriptedModel, resolve_model
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Model": "tether.models.base",
    "ModelError": "tether.models.base",
    "OpenAICompatModel": "tether.models.openai_compat",
    "FallbackModel": "tether.models.fallback",
    "AnthropicModel": "tether.models.anthropic",
    "LocalModel": "tether.models.local",
    "TextProtocolModel": "tether.models.text_protocol",
    "ScriptedModel": "tether.models.scripted",
    "ReplayModel": "tether.models.scripted",
    "RecordingModel": "tether.models.scripted",
    "Pricing": "tether.models.pricing",
    "resolve_model": "tether.models.resolve",
}

__all__ = [
    "AnthropicModel",
    "FallbackModel",
    "LocalModel",
    "Model",
    "ModelError",
    "OpenAICompatModel",
    "Pricing",
    "RecordingModel",
    "ReplayModel",
    "ScriptedModel",
    "TextProtocolModel",
    "resolve_model",
]

if TYPE_CHECKING:
    from tether.models.anthropic import AnthropicModel
    from tether.models.base import Model, ModelError
    from tether.models.fallback import FallbackModel
    from tether.models.local import LocalModel
    from tether.models.openai_compat import OpenAICompatModel
    from tether.models.pricing import Pricing
    from tether.models.resolve import resolve_model
    from tether.models.scripted import RecordingModel, ReplayModel, ScriptedModel
    from tether.models.text_protocol import TextProtocolModel


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tether.models' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
