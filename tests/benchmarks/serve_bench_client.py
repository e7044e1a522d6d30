"""One HTTP client of bench_serve.py: a keep-alive connection that reads and acks for a while.

    python serve_bench_client.py URL SECONDS MAX OUT

Loops until SECONDS have passed: ``POST /read?timeout=1s&max=MAX``, then ``POST /ack`` of what it got (one
round trip).  Writes to OUT a JSON object: round trips, messages, the read and ack latencies (seconds) and each
message's end-to-end latency (handled time minus its Kafka timestamp, ms).
"""

from __future__ import annotations

import http.client
import json
import sys
import time
from urllib.parse import urlsplit


def main() -> None:
    url, seconds, most, out = urlsplit(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)  # kept alive: HTTP/1.1
    reads: list[float] = []
    acks: list[float] = []
    end_to_end: list[float] = []
    round_trips = messages = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        connection.request("POST", f"/read?timeout=1s&max={most}", body=b"")
        response = connection.getresponse()
        body = response.read()
        reads.append(time.perf_counter() - started)
        if response.status != 200:
            continue
        got = json.loads(body)["messages"]
        now_ms = time.time() * 1000
        end_to_end += [now_ms - m["timestamp"] for m in got if m["timestamp"]]
        ids = [{"topic": m["topic"], "partition": m["partition"], "offset": m["offset"]} for m in got]
        started = time.perf_counter()
        connection.request("POST", "/ack", body=json.dumps(ids).encode(), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        acks.append(time.perf_counter() - started)
        if response.status == 200:
            round_trips += 1
            messages += len(got)
    connection.close()
    with open(out, "w") as file:
        json.dump({"round_trips": round_trips, "messages": messages, "reads": reads, "acks": acks,
                   "end_to_end": end_to_end}, file)  # fmt: skip


if __name__ == "__main__":
    main()
