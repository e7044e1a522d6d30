"""An HTTP client of ``marshal-workers serve`` as the end-to-end tests run it: a process with no Kafka client.

    python http_client.py NAME SINK URL [URL...]

Loops: ``POST /read``, appends one line per message to SINK (the sink app's format: ``NAME pid partition
offset value time``), then ``POST /ack`` and appends ``ACKED partition offset value time`` per acked
message to SINK + ".acked".  A server that does not answer is left for the next URL (fail-over).
Environment: MW_CLIENT_MAX (messages per read, default 10), MW_CLIENT_DELAY (seconds per message),
MW_CLIENT_NEVER_ACK=1 (read, never ack), MW_CLIENT_TOKEN. SIGTERM: finish the batch in hand, exit 0.
"""

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request

NAME, SINK, URLS = sys.argv[1], sys.argv[2], sys.argv[3:]
MAX = int(os.environ.get("MW_CLIENT_MAX", "10"))
DELAY = float(os.environ.get("MW_CLIENT_DELAY", "0"))
NEVER_ACK = os.environ.get("MW_CLIENT_NEVER_ACK") == "1"
TOKEN = os.environ.get("MW_CLIENT_TOKEN")
stopping = False


def stop(_signum, _frame):
    global stopping
    stopping = True


def post(url, body=None):
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else b"", method="POST")
    request.add_header("Content-Type", "application/json")
    if TOKEN:
        request.add_header("Authorization", f"Bearer {TOKEN}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def main():
    signal.signal(signal.SIGTERM, stop)
    turn = 0
    with open(SINK, "a", buffering=1) as sink, open(SINK + ".acked", "a", buffering=1) as acked:
        while not stopping:
            url = URLS[turn % len(URLS)]
            try:
                status, body = post(f"{url}/read?timeout=1s&max={MAX}")
            except OSError:
                turn += 1  # that server is gone: the next one
                time.sleep(0.2)
                continue
            if status == 503:
                turn += 1  # that server is stopping: the next one
                time.sleep(0.1)
                continue
            if status != 200:
                continue
            messages = json.loads(body)["messages"]
            for m in messages:
                time.sleep(DELAY)
                sink.write(f"{NAME} {os.getpid()} {m['partition']} {m['offset']} {m['value']} {time.time()}\n")
            if NEVER_ACK:
                continue
            ids = [{"topic": m["topic"], "partition": m["partition"], "offset": m["offset"]} for m in messages]
            try:
                status, body = post(f"{url}/ack", ids)
            except OSError:
                turn += 1
                continue
            refused = set()
            if status == 409 and json.loads(body)["error"] == "partly_refused":  # the others were acked
                refused = {(r["partition"], r["offset"]) for r in json.loads(body)["messages"]}
            elif status != 200:
                continue
            for m in messages:
                if (m["partition"], m["offset"]) not in refused:
                    acked.write(f"ACKED {m['partition']} {m['offset']} {m['value']} {time.time()}\n")


if __name__ == "__main__":
    main()
