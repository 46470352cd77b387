"""An HTTP server on 127.0.0.1 that never finishes an answer: it trickles one byte at a time, or stays
silent; or one that sends a given answer slowly, a piece at a time.

    with Trickler(every=0.3) as server:   # or Trickler(silent=True)
        OpenAICompatModel("m", base_url=server.base_url, deadline=1)...
    with Trickler(every=0.3, pieces=[b"data: {...}\\n\\n", ...], content_type="text/event-stream"):
        ...  # a slow but real stream: one complete event every 0.3 s, then the end

Per-read timeouts never fire against a trickle (a byte arrives every `every` seconds); only a total
deadline, or an idle timeout counted in complete replies or stream events, ends the call.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence


class Trickler:
    """An HTTP server on 127.0.0.1 that answers every request with headers and then one byte every
    `every` seconds, forever (or, with `silent`, never sends anything; or, with `pieces`, sends
    each piece `every` seconds after the last and then closes the connection). Counts connections."""

    def __init__(self, every: float = 0.3, silent: bool = False, pieces: Sequence[bytes] | None = None,
                 content_type: str = "application/json") -> None:
        self.every, self.silent, self.pieces, self.content_type = every, silent, pieces, content_type
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
                if self.silent:
                    self._stop.wait()
                elif self.pieces is not None:
                    conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: {self.content_type}\r\n"
                                 "Connection: close\r\n\r\n".encode())
                    for piece in self.pieces:  # the body ends when the connection closes
                        if self._stop.wait(self.every):
                            break
                        conn.sendall(piece)
                else:
                    conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: {self.content_type}\r\n"
                                 "Content-Length: 100000\r\n\r\n".encode())
                    while not self._stop.wait(self.every):
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
