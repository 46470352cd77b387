"""An HTTP server on 127.0.0.1 that never finishes an answer: it trickles one byte at a time, or stays silent.

    with Trickler(every=0.3) as server:   # or Trickler(silent=True)
        OpenAICompatModel("m", base_url=server.base_url, deadline=1)...

Per-read timeouts never fire against it (a byte arrives every `every` seconds); only a total
deadline ends the call.
"""

from __future__ import annotations

import socket
import threading


class Trickler:
    """An HTTP server on 127.0.0.1 that answers every request with headers and then one byte every
    `every` seconds, forever (or, with `silent`, never sends anything). Counts connections."""

    def __init__(self, every: float = 0.3, silent: bool = False) -> None:
        self.every, self.silent = every, silent
        self.connections = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self._server.getsockname()[1]}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                if not self.silent:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
                while not self._stop.wait(self.every):
                    if not self.silent:
                        conn.sendall(b" ")
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                continue
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def __enter__(self) -> Trickler:
        self._accept_thread = threading.Thread(target=self._accept, daemon=True)
        self._accept_thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._accept_thread.join(2)
        for thread in self._threads:
            thread.join(2)
        self._server.close()
