"""The application that tests/benchmarks/bench_coordination_batches.py runs: three handlers, one of each kind.

MW_BENCH_ALO_TOPIC (whole partitions, at least once), MW_BENCH_AMO_TOPIC (whole partitions, at most once:
a batch claim before each batch) and MW_BENCH_SHARED_TOPIC (shared=True: range leases).  Each handler only
parses the message: the benchmark counts coordination writes, not handler work.
"""

from __future__ import annotations

import os

from marshal_workers import App, Message

app = App()


def parse(msg: Message) -> None:
    msg.json()


app.handler(os.environ["MW_BENCH_ALO_TOPIC"])(parse)
app.handler(os.environ["MW_BENCH_AMO_TOPIC"], mode="amo", batch_size=50)(parse)
app.handler(os.environ["MW_BENCH_SHARED_TOPIC"], shared=True, range_size=50)(parse)
