"""MCP shapes to tether's and back: effect classes from confirmed hints, results to text."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as mt

from tether._types import Effect
from tether.mcp._config import ServerConfig


def effect_of(server: ServerConfig, tool: mt.Tool) -> Effect:
    """The effect class of an MCP tool. Annotations are the server's claims, so they count only where
    the user confirmed them (`trustAnnotations`); an explicit `effects` entry wins; otherwise the
    tool is irreversible."""
    settings = server.tether
    if tool.name in settings.effects:
        return settings.effects[tool.name]
    hints = tool.annotations
    if hints is None or not settings.annotations_confirmed(tool.name):
        return Effect.IRREVERSIBLE
    if hints.read_only_hint is True:
        return Effect.READ_ONLY
    # destructiveHint false: only additive updates (the spec's default is true)
    if hints.destructive_hint is False:
        return Effect.REVERSIBLE
    return Effect.IRREVERSIBLE


def annotations_of(tool: mt.Tool) -> dict[str, Any]:
    """The hints as the server sent them (camelCase, unset ones left out), for metadata and listings."""
    if tool.annotations is None:
        return {}
    return tool.annotations.model_dump(by_alias=True, exclude_none=True)


def result_text(result: mt.CallToolResult) -> str:
    """One text for the model: text blocks as they are, other blocks described in a line each, and
    structured content as JSON when no block carries text."""
    parts = [block_text(b) for b in result.content]
    if result.structured_content is not None and not any(isinstance(b, mt.TextContent) for b in result.content):
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(p for p in parts if p)


def block_text(block: Any) -> str:
    if isinstance(block, mt.TextContent):
        return block.text
    if isinstance(block, mt.ImageContent | mt.AudioContent):
        kind = "image" if isinstance(block, mt.ImageContent) else "audio"
        return f"[{kind} {block.mime_type}, {len(block.data) * 3 // 4} bytes, not shown]"
    if isinstance(block, mt.EmbeddedResource):
        res = block.resource
        if isinstance(res, mt.TextResourceContents):
            return f"[resource {res.uri}]\n{res.text}"
        return f"[resource {res.uri} ({res.mime_type or 'binary'}), {len(res.blob) * 3 // 4} bytes, not shown]"
    if isinstance(block, mt.ResourceLink):
        return f"[resource link {block.uri}: {block.name}{' - ' + block.description if block.description else ''}]"
    return f"[{getattr(block, 'type', type(block).__name__)} content, not shown]"
