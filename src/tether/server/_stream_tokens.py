"""Stream tokens: a browser's `EventSource` cannot send an Authorization header, so a web page asks
for a token for one task's event stream (`POST /v1/tasks/{id}/stream-token`, with its API key) and
puts it in the stream's URL (`?token=`).

A token names the task, the key that asked for it (the start of the key's hash) and when it expires,
signed (HMAC-SHA256) with the service's secret, which is kept in the database so every API process
accepts every other's tokens; the user is the key's. It opens that one task's stream, read-only, until
it expires or its key is revoked; being in a URL, it may end up in logs, which is why it is this narrow
and names no user."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

PREFIX = "st_"
_CONTEXT = b"tether stream token v1\n"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _mac(secret: bytes, payload: str) -> str:
    return _b64(hmac.new(secret, _CONTEXT + payload.encode(), hashlib.sha256).digest())


def make(secret: bytes, task_id: str, key_id: str, expires_at: float) -> str:
    """A token for the stream of `task_id`, asked for with the key `key_id`, until `expires_at`."""
    payload = _b64(json.dumps([task_id, key_id, int(expires_at)], separators=(",", ":")).encode())
    return f"{PREFIX}{payload}.{_mac(secret, payload)}"


def read(secret: bytes, token: str, task_id: str, now: float) -> str | None:
    """The key id of a genuine, unexpired token for `task_id`; None for anything else."""
    payload, _, mac = token.removeprefix(PREFIX).partition(".")
    if not token.startswith(PREFIX) or not hmac.compare_digest(mac.encode(), _mac(secret, payload).encode()):
        return None
    try:
        task, key_id, expires_at = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, TypeError):  # signed by us, so not reached unless the format changes
        return None
    if task != task_id or now >= expires_at:
        return None
    return str(key_id)
