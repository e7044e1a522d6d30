"""The live dashboard in a real headless browser: the ``dashboard`` command and ``run --dashboard``.

Real broker, real supervisors, the dashboard as a real process, Debian's chromium driven by Playwright.
Without chromium the tests are skipped, except in CI (the CI variable set), where they fail: CI installs it.
Set MW_UPDATE_SCREENSHOT=1 to write docs/dashboard.png from the first test.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from fleet import Fleet
from polling import poll_until
from processes import child_environment

from marshal_workers.kafka.embedded_broker import free_port

pytestmark = pytest.mark.broker

CHROMIUM = "/usr/bin/chromium"
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "dashboard.png"
TIMEOUT_MS = 30_000  # generous: hand-overs take an HB or two, the page updates every second


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: CI must install it (see .ci/run)")
    pytest.skip(f"{reason}: apt-get install chromium and pip install playwright to run the dashboard's browser tests")


@pytest.fixture
def page() -> Iterator[object]:
    """A page of a headless chromium (Debian's, never a downloaded one)."""
    executable = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if executable is None:
        _missing("chromium is not installed")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable)
        try:
            yield browser.new_page(viewport={"width": 1280, "height": 900})
        finally:
            browser.close()


def start_dashboard(fleet: Fleet, port: int, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            fleet.command("dashboard", "--port", str(port)),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_environment(),
            start_new_session=True,
        )


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


# The page marks each partition row with data-key, data-owner and data-state, and each hand-over row with
# data-key, data-from and data-to: the tests read those, as a person reads the table.
ALL_OWNED_BY = """([count, prefixes]) => {
  const rows = [...document.querySelectorAll('#partitions tbody tr[data-key]')];
  return rows.length === count && rows.every(r => r.dataset.state === 'fresh')
    && prefixes.every(p => rows.some(r => r.dataset.owner.startsWith(p)))
    && rows.every(r => prefixes.some(p => r.dataset.owner.startsWith(p)));
}"""
HANDED_OVER = """([from, to]) => [...document.querySelectorAll('#hand-overs tbody tr[data-key]')]
  .some(r => r.dataset.from.startsWith(from) && r.dataset.to.startsWith(to))"""


def test_the_dashboard_shows_every_partition_owned_then_a_hand_over(fleet: Fleet, page: object, tmp_path: Path) -> None:
    screenshot = bool(os.environ.get("MW_UPDATE_SCREENSHOT"))
    if screenshot:  # something to see: a backlog draining slowly, and a message that fails
        fleet.env |= {"MW_TEST_DELAY": "0.01", "MW_TEST_FAIL_VALUE": "fail"}
    fleet.start("a", "--balance", "fair")
    fleet.start("b", "--balance", "fair")
    port = free_port()
    dashboard = start_dashboard(fleet, port, tmp_path / "dashboard.log")
    try:
        url = f"http://127.0.0.1:{port}/"
        poll_until(lambda: answers(url + "api/state"), what="the dashboard serving")
        page.goto(url)  # type: ignore[attr-defined]
        page.wait_for_function(ALL_OWNED_BY, arg=[8, ["a/", "b/"]], timeout=TIMEOUT_MS)  # type: ignore[attr-defined]
        assert page.inner_text("#group") == fleet.group  # type: ignore[attr-defined]
        assert page.locator("#connection.live").count() == 1  # type: ignore[attr-defined]

        fleet.processes["a"].send_signal(signal.SIGTERM)
        page.wait_for_function(ALL_OWNED_BY, arg=[8, ["b/"]], timeout=TIMEOUT_MS)  # type: ignore[attr-defined]
        page.wait_for_function(HANDED_OVER, arg=["a/", "b/"], timeout=TIMEOUT_MS)  # type: ignore[attr-defined]
        assert fleet.processes["a"].wait(timeout=30) == 0
        members = page.locator("#members tbody tr[data-member]")  # type: ignore[attr-defined]
        assert members.count() == 1 and members.first.get_attribute("data-member").startswith("b/")
        if screenshot:
            take_screenshot(fleet, page)
    finally:
        dashboard.send_signal(signal.SIGTERM)
        try:
            code = dashboard.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(dashboard.pid, signal.SIGKILL)
            code = dashboard.wait(timeout=10)
    assert code == 0, (tmp_path / "dashboard.log").read_text()
    assert "dashboard stopped" in (tmp_path / "dashboard.log").read_text()


def take_screenshot(fleet: Fleet, page: object) -> None:
    """docs/dashboard.png: a backlog draining (lag, rates) and a dead letter, after the hand-over."""
    producer = Producer({"bootstrap.servers": fleet.brokers})
    producer.produce(fleet.topic, value=b"fail", partition=3)
    assert producer.flush(30) == 0
    fleet.produce(range(8 * 3000))  # 30 s of work per partition at 10 ms a message: still draining when shot
    page.wait_for_function(  # type: ignore[attr-defined]
        "() => document.querySelector('#dead-letters table') !== null", timeout=60_000
    )
    page.set_viewport_size({"width": 1440, "height": 900})  # type: ignore[attr-defined]  # no table cut short
    page.screenshot(path=str(SCREENSHOT), full_page=True)  # type: ignore[attr-defined]


def test_run_with_dashboard_serves_the_page_on_the_metrics_port(fleet: Fleet, page: object) -> None:
    port = free_port()
    fleet.start("only", "--metrics-port", str(port), "--dashboard", MARSHAL_WORKERS_METRICS_HOST="127.0.0.1")
    poll_until(lambda: answers(f"http://127.0.0.1:{port}/dashboard/api/state"), what="the metrics port serving")
    page.goto(f"http://127.0.0.1:{port}/dashboard")  # type: ignore[attr-defined]  # redirected to /dashboard/
    page.wait_for_function(ALL_OWNED_BY, arg=[8, ["only/"]], timeout=TIMEOUT_MS)  # type: ignore[attr-defined]
    assert page.url.endswith("/dashboard/")  # type: ignore[attr-defined]
    assert page.inner_text("#group") == fleet.group  # type: ignore[attr-defined]
