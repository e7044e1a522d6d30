"""HTTP clients of bench_serve.py: keep-alive connections that read and ack for a while.

    python serve_bench_client.py URL SECONDS MAX OUT [CONNECTIONS]

CONNECTIONS (default 1) clients in this process, each its own keep-alive connection, loop until SECONDS have
passed: ``POST /read?timeout=1s&max=MAX``, then ``POST /ack`` of what it got (one round trip).  A minimal
HTTP/1.1 client on asyncio streams, so the client costs little CPU beside the server it measures (the same
client measures the service and the bare aiohttp ceiling).  Writes to OUT a JSON object: round trips, messages,
the read and ack latencies (seconds) and each message's end-to-end latency (handled time minus its Kafka
timestamp, ms).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from urllib.parse import urlsplit


class Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, await self.reader.readexactly(length) if length else b""

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def one_client(url: str, seconds: float, most: int, found: dict[str, list[float] | int]) -> None:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    connection = Connection(parts.hostname, parts.port)
    reads, acks, end_to_end = found["reads"], found["acks"], found["end_to_end"]
    assert isinstance(reads, list) and isinstance(acks, list) and isinstance(end_to_end, list)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            status, body = await connection.post(f"/read?timeout=1s&max={most}")
            reads.append(time.perf_counter() - started)
            if status != 200:
                continue
            got = json.loads(body)["messages"]
            now_ms = time.time() * 1000
            end_to_end += [now_ms - m["timestamp"] for m in got if m["timestamp"]]
            ids = [{"topic": m["topic"], "partition": m["partition"], "offset": m["offset"]} for m in got]
            started = time.perf_counter()
            status, _ = await connection.post("/ack", json.dumps(ids).encode())
            acks.append(time.perf_counter() - started)
            if status == 200:
                found["round_trips"] += 1  # type: ignore[operator]
                found["messages"] += len(got)  # type: ignore[operator]
    finally:
        connection.close()


async def run(url: str, seconds: float, most: int, connections: int) -> dict[str, list[float] | int]:
    found: dict[str, list[float] | int] = {"round_trips": 0, "messages": 0, "reads": [], "acks": [], "end_to_end": []}
    await asyncio.gather(*(one_client(url, seconds, most, found) for _ in range(connections)))
    return found


def main() -> None:
    url, seconds, most, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    connections = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    found = asyncio.run(run(url, seconds, most, connections))
    with open(out, "w") as file:
        json.dump(found, file)


if __name__ == "__main__":
    main()
