"""Model adapters behind one protocol. Imported lazily, so `import tether` stays light.

    from tether.models import OpenAICompatModel, ScriptedModel, resolve_model
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Model": "tether.models._base",
    "ModelError": "tether.models._base",
    "OpenAICompatModel": "tether.models._openai_compat",
    "FallbackModel": "tether.models._fallback",
    "AnthropicModel": "tether.models._anthropic",
    "LocalModel": "tether.models._local",
    "TextProtocolModel": "tether.models._text_protocol",
    "ScriptedModel": "tether.models._scripted",
    "ReplayModel": "tether.models._scripted",
    "RecordingModel": "tether.models._scripted",
    "Pricing": "tether.models._pricing",
    "UnpricedModel": "tether.models._pricing",
    "resolve_model": "tether.models._resolve",
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
    "UnpricedModel",
    "resolve_model",
]

if TYPE_CHECKING:
    from tether.models._anthropic import AnthropicModel
    from tether.models._base import Model, ModelError
    from tether.models._fallback import FallbackModel
    from tether.models._local import LocalModel
    from tether.models._openai_compat import OpenAICompatModel
    from tether.models._pricing import Pricing, UnpricedModel
    from tether.models._resolve import resolve_model
    from tether.models._scripted import RecordingModel, ReplayModel, ScriptedModel
    from tether.models._text_protocol import TextProtocolModel


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tether.models' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
