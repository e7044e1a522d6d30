"""A TCP proxy in front of a real broker that hangs up on, or slows down, chosen Kafka requests.

Tansu creates any topic it is asked for, so a cluster that refuses to create
one (no CREATE permission, a policy) is played by this proxy: it forwards
every request frame unchanged except those whose API key is refused, on
which it closes the connection.  A slow cluster is played by delaying the
requests whose API key is in ``delay`` (e.g. every Produce) before passing
them on, a stalled one by holding them between ``stall()`` and ``resume()``, and a write lost on the way by
dropping them between ``drop()`` and ``resume()`` (never passed on, never answered).
``observe``, if given, sees every request frame passed on (its body, from the API key on): a benchmark
counts what clients send with it.
The broker behind it must advertise the proxy's address, so that clients
never go around it.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable

PRODUCE = 0  # Kafka API keys
CREATE_TOPICS = 19


class KafkaProxy:
    def __init__(
        self,
        listen_port: int,
        upstream_port: int,
        refuse: frozenset[int] = frozenset(),
        delay: frozenset[int] = frozenset(),
        delay_s: float = 0.0,
        host: str = "127.0.0.1",
        observe: Callable[[bytes], None] | None = None,
    ) -> None:
        self.host, self.listen_port, self.upstream_port, self.refuse = host, listen_port, upstream_port, refuse
        self.delay, self.delay_s, self.observe = delay, delay_s, observe
        self.refused = 0
        self._flowing = threading.Event()
        self._flowing.set()
        self._server = socket.create_server((host, listen_port))
        self._sockets: list[socket.socket] = [self._server]
        self._closing = False
        self._dropping = False

    def start(self) -> KafkaProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stall(self) -> None:
        """Hold every request of the delayed kinds from now on (requests already passed on are answered)."""
        self._flowing.clear()

    def drop(self) -> None:
        """Throw every request of the delayed kinds away from now on: the broker never sees them."""
        self._dropping = True

    def resume(self) -> None:
        self._dropping = False
        self._flowing.set()

    def close(self) -> None:
        self._flowing.set()
        self._closing = True
        for sock in list(self._sockets):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection((self.host, self.upstream_port))
            self._sockets += [client, upstream]
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._responses, args=(upstream, client), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while True:
                header = _read_exactly(client, 4)
                body = _read_exactly(client, struct.unpack(">i", header)[0])
                (api_key,) = struct.unpack(">h", body[:2])
                if api_key in self.refuse:
                    self.refused += 1
                    break
                if api_key in self.delay:
                    if self._dropping:
                        continue
                    self._flowing.wait()
                    time.sleep(self.delay_s)
                if self.observe is not None:
                    self.observe(body)
                upstream.sendall(header + body)
        except OSError:
            pass
        for sock in (client, upstream):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _responses(self, upstream: socket.socket, client: socket.socket) -> None:
        try:
            while chunk := upstream.recv(65536):
                client.sendall(chunk)
        except OSError:
            pass


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError("peer closed")
        data += chunk
    return bytes(data)
