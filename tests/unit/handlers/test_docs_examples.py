"""The Python examples in README.md and docs/ run, so they cannot rot: each block must execute and
register what it says."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from fake_record import FakeRecord

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def python_blocks() -> list[tuple[str, int, str]]:
    return [
        (page.name, number, code)
        for page in PAGES
        for number, code in enumerate(BLOCK.findall(page.read_text()), start=1)
    ]


@pytest.mark.parametrize(("page", "number", "code"), python_blocks(), ids=lambda v: str(v)[:30])
def test_a_python_example_runs(page: str, number: int, code: str) -> None:
    run_as_module(code, f"example_{number}", f"{page} example {number}")


def run_as_module(code: str, name: str, filename: str = "<example>") -> dict[str, Any]:
    """Run an example as the module ``name`` (in sys.modules while it runs, as an imported module is: a dataclass
    needs its module there); its namespace."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(code, filename, "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    return module.__dict__


def test_the_concurrency_page_registers_what_it_describes() -> None:
    [code, *_] = BLOCK.findall((ROOT / "docs" / "concurrency.md").read_text())
    namespace: dict[str, Any] = {"__name__": "concurrency_example"}
    exec(code, namespace)
    handlers = namespace["app"].handlers
    described = {topic: (h.concurrency, h.ordering.value, h.is_async, h.batch) for topic, h in handlers.items()}
    assert described == {
        "emails": (64, "key", False, False),
        "pushes": (256, "none", True, False),
        "audit": (8, "none", False, True),
    }


def test_the_shared_partitions_page_registers_what_it_describes() -> None:
    [code, *_] = BLOCK.findall((ROOT / "docs" / "shared-partitions.md").read_text())
    namespace: dict[str, Any] = {"__name__": "shared_example"}
    exec(code, namespace)
    handlers = namespace["app"].handlers
    described = {
        t: (h.shared, h.mode.value, h.range_size, h.adaptive_ranges, h.pending_timeout, h.max_deliveries)
        for t, h in handlers.items()
    }
    assert described == {
        "thumbnails": (True, "alo", 50, True, 60.0, 5),
        "uploads-audit": (True, "amo", 200, False, 60.0, 5),
    }


def test_the_handlers_page_registers_the_policy_it_describes_and_its_handler_does_what_it_says() -> None:
    from marshal_workers import Ignore, Reject, Retry
    from marshal_workers.handlers.app import Message
    from marshal_workers.handlers.retry_policy import RetryPolicy

    [code, *_] = BLOCK.findall((ROOT / "docs" / "handlers.md").read_text())
    namespace: dict[str, Any] = {"__name__": "handlers_example"}
    exec(code, namespace)
    handler = namespace["app"].handlers["orders"]
    assert handler.retry_policy == RetryPolicy(
        retries=5,
        backoff=1.0,
        backoff_max=120.0,
        jitter=True,
        retry_on=(ConnectionError, TimeoutError, namespace["PaymentsDown"]),
        no_retry_on=(ConnectionRefusedError,),
    )

    def outcome(value: bytes, attempt: int = 1) -> type[BaseException] | None:
        try:
            handler.function(Message(FakeRecord(value=value), attempt))
        except (Ignore, Reject, Retry) as exc:
            return type(exc)
        return None

    assert outcome(b"{}") is Reject
    assert outcome(b'{"amount": 1, "test": true}') is Ignore
    assert outcome(b'{"amount": 1, "provider_busy": true}') is Retry
    assert outcome(b'{"amount": 1, "provider_busy": true}', attempt=3) is None


def test_the_handlers_page_send_example_sends_what_it_says() -> None:

    from marshal_workers.handlers.app import Message

    blocks = BLOCK.findall((ROOT / "docs" / "handlers.md").read_text())
    [code] = [block for block in blocks if "app.send(" in block and "run_app" not in block]
    namespace: dict[str, Any] = {"__name__": "send_example"}
    exec(code, namespace)
    app = namespace["app"]
    sent: list[tuple[Any, ...]] = []

    class Recorder:
        def send(self, *encoded: Any) -> None:
            sent.append(encoded)

    app.outbox = Recorder()
    app.handlers["orders"].function(
        Message(FakeRecord(value=b'{"id": 7, "amount": 12}', key=b"c-1", partition=0, offset=3))
    )
    assert sent == [
        ("invoices", b'{"order":7,"amount":12}', b"c-1", [("source", b"orders/0/3")]),
        ("audit", b"invoiced 7", None, None),
    ]


def test_the_handlers_page_running_app_example_is_the_one_the_suite_runs() -> None:
    """The example is shown on the page and run by the suite as examples/test_invoices.py (with a broker): the page's
    block, its imports aside, is in that file word for word, and so is each of its imports."""
    [code] = [block for block in BLOCK.findall((ROOT / "docs" / "handlers.md").read_text()) if "running_app(" in block]
    run = (ROOT / "examples" / "test_invoices.py").read_text()
    imports = [line for line in code.splitlines() if line.startswith(("import ", "from "))]
    body = code[code.index("\ndef test_") + 1 :]
    assert body in run, "docs/handlers.md's running_app example differs from examples/test_invoices.py"
    assert imports and all(line in run.splitlines() for line in imports)
    assert "create_topics" not in body and "NewTopic" not in run, "the fixture creates the handler's topic itself"


def test_the_typed_handlers_example_decodes_and_dead_letters_what_it_says(capsys: pytest.CaptureFixture[str]) -> None:
    import msgspec

    from marshal_workers import PayloadError
    from marshal_workers.testing import make_message, run_handler

    text = (ROOT / "docs" / "handlers.md").read_text()
    section = text[text.index("## Typed handlers") : text.index("## Time limits")]
    [code] = BLOCK.findall(section)
    app = run_as_module(code, "typed_example")["app"]

    results = run_handler(app, "orders", [{"id": 1, "amount": 120}, {"id": 2, "amount": "lots"}, b"{not json"])
    assert [r.outcome for r in results] == ["done", "dead_letter", "dead_letter"]
    assert "invoice 1 120 EUR" in capsys.readouterr().out
    bad = dict(results[1].dead_letter_headers or [])
    assert bad["error_type"] == b"PayloadError" and b"$.amount" in bad["error"]
    assert isinstance(results[2].error, PayloadError) and results[1].attempts == 1

    refund = make_message(msgspec.msgpack.encode({"order_id": 1, "reason": "late"}), offset=9)
    [done] = run_handler(app, "refunds", [refund])
    assert done.outcome == "done" and "refund 1 from refunds 0 9 try 1" in capsys.readouterr().out

    audited = run_handler(app, "orders.audit", [{"id": 1, "amount": 5}, {"amount": 5}, {"id": 3, "amount": 5}])
    assert [r.outcome for r in audited] == ["done", "dead_letter", "done"]
    assert "audited 2 orders" in capsys.readouterr().out
