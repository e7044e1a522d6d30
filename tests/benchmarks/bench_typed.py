"""Benchmark: a typed handler (a msgspec Struct, decoded by the worker) against ``msg.json()`` in the handler, per
message, on the same ~200-byte JSON records, in one process, in the same run.

    /work/venv/bin/python tests/benchmarks/bench_typed.py [--messages 50000] [--rounds 7]

What is timed: the one-call loop's hot statement, ``function(Message(record))``, over N in-memory records
(marshal_workers.testing's FakeRecord: no broker, so only the handler path is measured), ``function`` being the
handler exactly as a worker gets it from ``App.handler_in_worker``:

* json     the untyped handler ``def h(msg: Message)`` that reads ``msg.json()`` (orjson to a dict) and a field;
* struct   the typed handler ``def h(order: Order)``: msgspec decodes into the Struct (a decoder built once);
* message  ``def h(msg: Message[Order])``: the same, handed over as ``msg.body``;
* dataclass, pydantic: the other model kinds, for comparison;
* bare     the untyped handler that decodes nothing: the loop's own cost, subtracted from the others.

Rounds alternate the variants, so a busy neighbour slows them all alike; each variant's figure is its fastest
round.  On this shared 2-core machine wall-clock figures move by 10-40 % between runs: the ratio within one run
is what to read.  A benchmark, not a test: it prints, and the exit status is 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import checkout  # noqa: F401  (puts the checkout on sys.path)
import msgspec
import pydantic

from marshal_workers import App, Message
from marshal_workers.testing import FakeRecord

VALUE = b'{"id": %d, "amount": 1234, "currency": "EUR", "customer": "c-%d", "note": "' + b"x" * 120 + b'"}'


class Order(msgspec.Struct):
    id: int
    amount: int
    currency: str
    customer: str
    note: str


@dataclasses.dataclass
class OrderData:
    id: int
    amount: int
    currency: str
    customer: str
    note: str


class OrderModel(pydantic.BaseModel):
    id: int
    amount: int
    currency: str
    customer: str
    note: str


def handlers() -> dict[str, Callable[[Any], Any]]:
    """Each variant's handler as a worker calls it."""
    app = App(group="bench-typed")

    def bare(msg: Message) -> None:
        pass

    def as_json(msg: Message) -> int:
        return msg.json()["id"]  # type: ignore[no-any-return]

    def as_struct(order: Order) -> int:
        return order.id

    def as_message(msg: Message[Order]) -> int:
        return msg.body.id  # type: ignore[attr-defined, no-any-return]

    def as_dataclass(order: OrderData) -> int:
        return order.id

    def as_pydantic(order: OrderModel) -> int:
        return order.id

    variants = {
        "bare": bare,
        "json": as_json,
        "struct": as_struct,
        "message": as_message,
        "dataclass": as_dataclass,
        "pydantic": as_pydantic,
    }
    for name, function in variants.items():
        app.handler(name)(function)
    assert app.handlers["bare"].function is bare and app.handlers["json"].function is as_json  # untyped: as they are
    return {name: app.handler_in_worker(name).function for name in variants}


def one_round(function: Callable[[Any], Any], records: list[Any]) -> float:
    """Seconds for the one-call loop's hot statement over ``records``."""
    wrap = Message
    started = time.perf_counter()
    for record in records:
        function(wrap(record))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    n = args.messages
    values = [VALUE % (i, i) for i in range(n)]
    print(
        f"bench_typed: {n:,} records of {sum(map(len, values)) / n:.0f} bytes, {args.rounds} rounds, "
        "fastest round per variant",
        flush=True,
    )
    functions = handlers()
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, function in functions.items():
            records = [FakeRecord("bench", 0, i, None, v, None, (1, 0)) for i, v in enumerate(values)]
            elapsed = one_round(function, records)
            best[name] = min(best.get(name, elapsed), elapsed)
    floor = best["bare"]
    for name in functions:
        per = best[name] / n * 1e9
        decode = (best[name] - floor) / n * 1e9
        print(f"  {name:<10} {per:8,.0f} ns/message   {decode:8,.0f} ns/message above the bare loop")
    json_cost, struct_cost = best["json"] - floor, best["struct"] - floor
    print(f"\n  typed (msgspec Struct) / msg.json(), per message:   {best['struct'] / best['json']:.2f}")
    print(f"  typed / msg.json(), decoding and handler call only:  {struct_cost / json_cost:.2f}")


if __name__ == "__main__":
    main()
