"""A tiny TCP proxy for tests: forwards to a target until `cut()`, then black-holes (accepts,
never answers): one agent's network path to the head failing while everything else works."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    """Listens on `host`:free port (`url`, with `scheme`: TLS passes through untouched),
    forwards each connection to `target`."""

    def __init__(
        self, target: tuple[str, int], host: str = "127.0.0.1", scheme: str = "http"
    ) -> None:
        self.target = target
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._listener = socket.create_server((host, 0))
        self.url = f"{scheme}://{host}:{self._listener.getsockname()[1]}"
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """From now on nothing passes either way; connections hang rather than fail."""
        self._cut.set()

    def close(self) -> None:
        self._closed.set()
        self._cut.set()
        self._listener.close()
        with self._lock:
            for s in self._held:
                with contextlib.suppress(OSError):
                    s.close()

    def _keep(self, s: socket.socket) -> None:
        with self._lock:
            self._held.append(s)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._keep(client)
            if self._cut.is_set():
                continue  # held open, never answered
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            self._keep(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.2)
        while not self._closed.is_set():
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            if self._cut.is_set():
                continue  # dropped on the floor
            try:
                dst.sendall(data)
            except OSError:
                return
