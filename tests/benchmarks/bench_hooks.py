"""Benchmark: what one empty ``@app.before_message`` hook adds per message, in instructions (valgrind).

    /work/venv/bin/python tests/benchmarks/bench_hooks.py [--messages 20000] [--rounds 2]

Wall-clock and CPU-second ratios on this shared 2-core machine move by 10-40 % from one run to the next
(bench_run.py's "f" against "c"), too much to tell a 3 % cost.  Instructions do not: callgrind counts the
same program's instructions the same way whatever else the machine is doing.

What is counted: a process that consumes N messages (~200-byte JSON values, one partition of the embedded
broker) with the worker's fetch settings and runs, on each, the ALO loop's hot statements (``function(
Message(record))`` and the progress store into an array), ``function`` being the handler exactly as a worker
gets it from ``App.handler_in_worker``: the bare handler (no hook registered) or the handler wrapped by one empty
before_message hook.  A third variant gives the floor of any hook mechanism: the loop itself calls an empty Python
function before the bare handler, with no wrapper (one Python call per message, all a hook can cost at least).  The handler is bench_app's: the value parsed with ``msg.json()``.  Each variant runs at
N and 2N messages; instructions per message = (I(2N) - I(N)) / N, so start-up and imports cancel out.  This
leaves out the supervisor and the slot's other work, so the ratio it gives is an upper bound of the hook's
share of a worker's cost per message.

Target (issue 14): one empty hook adds under 3 % per message.  A benchmark, not a test: a miss prints FAIL and
the exit status stays 0.
"""

from __future__ import annotations

import array

import callgrind
import checkout  # noqa: F401  (puts the checkout on sys.path)

TARGET = 0.03
VALUE = b'{"id": %d, "amount": 1234, "currency": "EUR", "note": "' + b"x" * 140 + b'"}'


VARIANTS = {"bare": "no hook", "hook": "one empty before_message hook", "floor": "floor: one empty call inline"}


def empty(msg: object) -> None:
    pass


def inner(brokers: str, topic: str, count: int, variant: str) -> None:
    """Run under valgrind: consume ``count`` messages and handle each as the one-call loop (one_call_loop.py) does."""
    from confluent_kafka import Consumer, TopicPartition

    from marshal_workers import App, Message
    from marshal_workers.core.config import Settings
    from marshal_workers.kafka import client_profiles

    app = App(group="bench-hooks")

    @app.handler(topic)
    def handle(msg: Message) -> None:
        msg.json()

    if variant == "hook":

        @app.before_message
        def before(msg: Message) -> None:
            pass

    function = app.handler_in_worker(topic).function
    consumer = Consumer(client_profiles.worker_consumer(Settings(brokers=brokers, group="bench-hooks")))
    consumer.assign([TopicPartition(topic, 0, 0)])
    fields, wrap, handled = array.array("q", [0]), Message, 0
    while handled < count:
        for record in consumer.consume(min(500, count - handled), 1.0):
            if record.error() is not None:
                continue
            if variant == "floor":
                message = wrap(record)
                empty(message)
                function(message)
            else:
                function(wrap(record))
            fields[0] = record.offset() + 1
            handled += 1
    consumer.close()


def main() -> None:
    args = callgrind.arguments(__doc__.split("\n\n")[0], VARIANTS).parse_args()
    if args.inner:
        inner(args.brokers, args.topic, args.messages, args.variant)
        return

    from marshal_workers.kafka.embedded_broker import EmbeddedBroker

    n = args.messages
    print(f"bench_hooks: instructions per message (callgrind), N = {n:,} and 2N, {args.rounds} round(s)", flush=True)
    with EmbeddedBroker() as broker:
        topic = callgrind.one_partition_topic(broker.bootstrap, "bench-hooks", (VALUE % i for i in range(2 * n)))
        per_message: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
        for round_number in range(1, args.rounds + 1):
            for variant, label in VARIANTS.items():
                once, twice = (
                    callgrind.instructions(__file__, callgrind.inner_arguments(broker.bootstrap, topic, count, variant))
                    for count in (n, 2 * n)
                )
                per_message[variant].append((twice - once) / n)
                print(
                    f"  round {round_number} {label:<31} {per_message[variant][-1]:10,.0f} instructions/message "
                    f"(I(N) {once:,}, I(2N) {twice:,})",
                    flush=True,
                )
    bare, hooked, floor = (min(per_message[variant]) for variant in VARIANTS)
    added = hooked / bare - 1
    print()
    print(f"  no hook              {bare:10,.0f} instructions/message (lowest of {args.rounds})")
    print(f"  one empty hook       {hooked:10,.0f} instructions/message (lowest of {args.rounds})")
    print(
        f"  added by the hook    {hooked - bare:10,.0f} instructions/message = {added:.1%}   target < {TARGET:.0%}   "
        f"{'PASS' if added < TARGET else 'FAIL'}"
    )
    print(
        f"  floor (one call)     {floor - bare:10,.0f} instructions/message = {floor / bare - 1:.1%}   "
        "what any hook costs at least: one Python call"
    )


if __name__ == "__main__":
    main()
