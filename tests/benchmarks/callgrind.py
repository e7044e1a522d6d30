"""Instructions counted by valgrind's callgrind for one run of a benchmark's inner process.

Wall-clock and CPU-second ratios on this shared 2-core machine move by 10-40 % from one run to the next;
instruction counts do not: callgrind counts the same program's instructions the same way whatever else the
machine is doing.  Needs valgrind (apt-get install valgrind).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterable

from checkout import ROOT  # and the checkout on sys.path


def instructions(script: str, arguments: list[str], env: dict[str, str] | None = None) -> int:
    """The instructions valgrind counted for ``python script arguments...``."""
    with tempfile.TemporaryDirectory() as scratch:
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={scratch}/out",
            sys.executable,
            script,
            *arguments,
        ]
        environment = os.environ | {"PYTHONPATH": str(ROOT)} | (env or {})
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=1800, env=environment)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode != 0 or not found:
            raise RuntimeError(f"valgrind run failed ({done.returncode}):\n{done.stderr[-2000:]}")
        return int(found.group(1))


def arguments(description: str, variants: dict[str, str]) -> argparse.ArgumentParser:
    """The options every callgrind benchmark takes, and the hidden ones of its inner runs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--messages", type=int, default=20_000, help="N (each variant also runs at 2N)")
    parser.add_argument("--rounds", type=int, default=2, help="measurements of each variant (all are shown)")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=variants, default=next(iter(variants)), help=argparse.SUPPRESS)
    parser.add_argument("--brokers", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    return parser


def inner_arguments(brokers: str, topic: str, count: int, variant: str) -> list[str]:
    """What an inner run is started with (the script's own --inner options)."""
    return ["--inner", "--brokers", brokers, "--topic", topic, "--messages", str(count), "--variant", variant]


def one_partition_topic(bootstrap: str, name: str, values: Iterable[bytes]) -> str:
    """A new one-partition topic ``name``-<random> holding ``values``."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"{name}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i, value in enumerate(values):
        producer.produce(topic, value)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    return topic
