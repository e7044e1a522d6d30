"""``marshal-workers run``: supervisors and workers as real processes on a real broker."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer
from fleet import Fleet
from polling import poll_until
from processes import pid_gone, run_cli

from marshal_workers.core.exit_codes import ExitCode

pytestmark = pytest.mark.broker


def all_handled(fleet: Fleet, count: int) -> bool:
    return len(fleet.counts()) == count


def test_two_supervisors_share_a_topic_and_sigterm_hands_over_with_nothing_lost_or_repeated(fleet: Fleet) -> None:
    total = 4000
    fleet.env["MW_TEST_DELAY"] = "0.001"  # slow enough that SIGTERM lands midway
    first = fleet.start("first", "--max-partitions", "4")
    poll_until(lambda: len(fleet.worker_pids("first")) == 4, what="the first supervisor to claim its 4")
    fleet.start("second")
    poll_until(lambda: len(fleet.worker_pids("second")) == 4, what="the second supervisor to claim the rest")
    fleet.produce(range(total))
    poll_until(lambda: len(fleet.counts()) > total // 4, what="processing to be under way")

    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) == ExitCode.OK
    poll_until(lambda: all_handled(fleet, total), timeout=60, what="every message")

    counts = fleet.counts()
    assert sorted(counts, key=int) == [str(n) for n in range(total)]
    assert [v for v, n in counts.items() if n > 1] == [], "a clean hand-over repeats nothing"
    by_client = {line.client for line in fleet.lines()}
    assert by_client == {"first", "second"}
    handed_over = {line.partition for line in fleet.lines() if line.client == "first"}
    assert {line.partition for line in fleet.lines() if line.client == "second"} >= handed_over
    assert "released" in fleet.log_of("first")


def test_a_killed_worker_is_restarted_and_its_partition_goes_on(fleet: Fleet) -> None:
    fleet.start("only")
    poll_until(lambda: len(fleet.worker_pids("only")) == 8, what="8 workers")
    workers = fleet.worker_pids("only")
    fleet.produce(range(800))
    poll_until(lambda: all_handled(fleet, 800), what="the first messages")

    os.kill(workers[3], signal.SIGKILL)
    poll_until(lambda: fleet.worker_pids("only").get(3) not in (None, workers[3]), what="a new worker for partition 3")
    fleet.produce(range(800, 1600))
    poll_until(lambda: all_handled(fleet, 1600), what="every message, including partition 3's")
    assert "restarting" in fleet.log_of("only")


@pytest.mark.parametrize("mode", ["alo", "amo"])
def test_a_killed_supervisor_takes_its_workers_along_and_the_other_takes_over(fleet: Fleet, mode: str) -> None:
    total = 3000
    fleet.env |= {"MW_TEST_MODE": mode, "MW_TEST_DELAY": "0.002", "MW_TEST_BATCH_SIZE": "20"}
    doomed = fleet.start("doomed", "--max-partitions", "4")
    poll_until(lambda: len(fleet.worker_pids("doomed")) == 4, what="4 workers")
    fleet.start("survivor")
    poll_until(lambda: len(fleet.worker_pids("survivor")) == 4, what="the survivor's 4 workers")
    orphans = list(fleet.worker_pids("doomed").values())
    fleet.produce(range(total))
    poll_until(lambda: len(fleet.counts()) > total // 4, what="processing to be under way")

    os.kill(doomed.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    doomed.wait(timeout=10)
    poll_until(lambda: all(pid_gone(pid) for pid in orphans), timeout=10, what="the orphaned workers to die")
    assert time.monotonic() - killed_at < 10
    poll_until(lambda: len(fleet.worker_pids("survivor")) == 8, timeout=15, what="the take-over")

    if mode == "alo":
        poll_until(lambda: all_handled(fleet, total), timeout=60, what="every message (at least once)")
    else:
        # At most once: nothing twice; what is lost is at most the batch each killed worker had claimed.
        poll_until(lambda: len(fleet.counts()) >= total - 4 * 20, timeout=60, what="everything but the lost batches")
        assert max(fleet.counts().values()) == 1, "at most once: no message handled twice"


def test_a_frozen_supervisor_handles_nothing_more_once_its_partitions_are_taken(fleet: Fleet) -> None:
    """SIGSTOP longer than 2*HB, then SIGCONT: its workers stopped at the lease, and stay stopped."""
    fleet.env |= {"MW_TEST_MODE": "amo", "MW_TEST_DELAY": "0.002", "MW_TEST_BATCH_SIZE": "10"}
    frozen = fleet.start("frozen", "--max-partitions", "4")
    poll_until(lambda: len(fleet.worker_pids("frozen")) == 4, what="4 workers")
    fleet.start("other")
    poll_until(lambda: len(fleet.worker_pids("other")) == 4, what="the other's 4 workers")
    fleet.produce(range(2000))
    poll_until(lambda: len(fleet.counts()) > 200, what="processing to be under way")

    os.kill(frozen.pid, signal.SIGSTOP)
    stopped_at = time.time()
    try:
        poll_until(lambda: len(fleet.worker_pids("other")) == 8, timeout=20, what="the take-over")
        taken_at = time.time()
        fleet.produce(range(2000, 3000))
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    poll_until(lambda: all_handled(fleet, 3000) or len(fleet.counts()) >= 3000 - 4 * 10, timeout=60, what="the rest")

    late = [line for line in fleet.lines() if line.client == "frozen" and line.at > taken_at]
    assert late == [], "a frozen supervisor's workers handle nothing once others own the partitions"
    assert max(fleet.counts().values()) == 1, "at most once across the freeze"
    assert taken_at - stopped_at >= 2.0, "others waited for 2*HB before taking over"
    poll_until(lambda: fleet.worker_pids("frozen") == {}, timeout=15, what="the woken supervisor to stop its workers")


def test_a_failing_message_is_retried_then_dead_lettered_and_the_partition_goes_on(fleet: Fleet) -> None:
    fleet.env["MW_TEST_FAIL_VALUE"] = "13"
    fleet.start("only")
    produced_at = 1_700_000_000_000
    fleet.produce(range(80), headers=[("traceparent", b"00-4bf92f35-00f067aa-01")], timestamp=produced_at)
    poll_until(lambda: all_handled(fleet, 79), what="every other message")
    assert "13" not in fleet.counts()

    [message] = fleet.dead_letters(1)
    headers = dict(message.headers())
    assert message.value() == b"13"
    assert headers["traceparent"] == b"00-4bf92f35-00f067aa-01", "the original headers are kept"
    assert message.timestamp()[1] == produced_at, "and so is the original timestamp"
    assert headers["original_topic"] == fleet.topic.encode()
    assert (headers["original_partition"], headers["original_offset"]) == (b"5", b"1")
    assert b"cannot handle" in headers["error"] and headers["error_type"] == b"ValueError"
    assert fleet.log_of("only").count("retry") == 2


def test_dlq_limit_releases_the_partition_as_sick_instead_of_draining_it_into_the_dead_letter_topic(
    fleet: Fleet,
) -> None:
    fleet.env |= {"MW_TEST_FAIL_FROM": "40", "MW_TEST_DLQ_LIMIT": "2"}  # offsets 5..9 of every partition fail
    fleet.start("only")
    fleet.produce(range(80))
    poll_until(lambda: all_handled(fleet, 40), what="the messages before the failures")

    def released_at_the_third_failure() -> bool:
        rows = fleet.status_rows()
        return len(rows) == 8 and all(row["state"] == "released" and row["offset"] == 7 for row in rows.values())

    poll_until(released_at_the_third_failure, timeout=60, interval=0.5, what="every partition released at offset 7")
    dead = fleet.dead_letters(16)
    assert sorted(int(m.value()) for m in dead) == list(range(40, 56)), "two dead letters in a row per partition"
    assert "(dlq_limit): releasing the partition as sick" in fleet.log_of("only")


def run_refused(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``marshal-workers run ARGS`` to its end (a run that refuses to start)."""
    return run_cli("run", *args, cwd=cwd)


def test_a_bad_import_path_is_a_clear_error(tmp_path: Path) -> None:
    result = run_refused("no_such_module_here:app", "--group", "g", cwd=tmp_path)
    assert result.returncode == ExitCode.APP_LOAD_ERROR
    assert "cannot import module 'no_such_module_here'" in result.stderr


def test_an_app_without_handlers_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty_app.py").write_text("from marshal_workers import App\napp = App(group='g')\n")
    result = run_refused("empty_app:app", cwd=tmp_path)
    assert result.returncode == ExitCode.NO_HANDLERS
    assert "has no handlers" in result.stderr


def test_a_handler_for_a_missing_topic_is_a_clear_error_before_any_fork(tmp_path: Path, kafka_brokers: str) -> None:
    (tmp_path / "lost_app.py").write_text(
        "from marshal_workers import App\napp = App(group='g')\n"
        "@app.handler('no-such-topic-anywhere')\ndef handle(msg): pass\n"
    )
    started = time.monotonic()
    result = run_refused("lost_app:app", "--brokers", kafka_brokers, cwd=tmp_path)
    assert result.returncode == ExitCode.UNKNOWN_TOPIC
    assert "handler topic 'no-such-topic-anywhere' does not exist" in result.stderr
    assert time.monotonic() - started < 30


def test_a_message_its_worker_keeps_dying_on_is_dead_lettered_as_worker_lost_and_the_partition_goes_on(
    fleet: Fleet,
) -> None:
    fleet.env |= {"MW_TEST_CRASH_VALUE": "10", "MARSHAL_WORKERS_CRASH_LIMIT": "3"}  # the worker os._exit()s on it
    fleet.start("only")
    fleet.produce(range(40))  # value 10 is partition 2's second message
    poll_until(lambda: all_handled(fleet, 39), timeout=60, what="every other message, partition 2's included")
    [dead] = fleet.dead_letters(1)
    headers = dict(dead.headers())
    assert (dead.value(), headers["error_type"], headers["original_offset"]) == (b"10", b"WorkerLost", b"1")
    assert "died 3 times in a row at offset 1" in fleet.log_of("only")
    assert fleet.status_rows()[2]["state"] == "fresh", "the partition goes on"


def test_a_batch_its_worker_keeps_dying_on_is_dead_lettered_as_worker_lost_and_the_partition_goes_on(
    fleet: Fleet,
) -> None:
    fleet.env |= {"MW_TEST_CRASH_VALUE": "10", "MARSHAL_WORKERS_CRASH_LIMIT": "3", "MW_TEST_BATCH": "1"}
    fleet.produce(range(40))  # value 10 is partition 2's second message: its batch is partition 2's first
    fleet.start("only")
    found = poll_until(
        lambda: re.search(
            r"died 3 times in a row .*dead-lettering its batch \(offsets (\d+)\.\.(\d+)\)", fleet.log_of("only")
        ),
        timeout=60,
        what="the batch to be given up on",
    )
    batch = range(int(found.group(1)), int(found.group(2)) + 1)
    assert 1 in batch, "the batch dead-lettered is the one the worker died in"
    dead = fleet.dead_letters(len(batch))
    assert sorted(int(dict(d.headers())["original_offset"]) for d in dead) == list(batch)
    assert {(dict(d.headers())["error_type"], dict(d.headers())["original_partition"]) for d in dead} == {
        (b"WorkerLost", b"2")
    }
    fleet.produce(range(40, 48))  # one more message on every partition, partition 2's included
    poll_until(lambda: "42" in fleet.counts(), timeout=60, what="partition 2 to go on after its dead batch")
    assert fleet.status_rows()[2]["state"] == "fresh"


def test_a_worker_that_keeps_crashing_with_on_error_release_has_its_partition_released_as_sick(fleet: Fleet) -> None:
    fleet.env |= {"MW_TEST_CRASH_VALUE": "10", "MARSHAL_WORKERS_CRASH_LIMIT": "3", "MW_TEST_ON_ERROR": "release"}
    fleet.start("only")
    fleet.produce(range(40))  # value 10 is partition 2's second message
    poll_until(lambda: fleet.status_rows()[2]["state"] == "released", timeout=30, what="partition 2 released")
    assert fleet.status_rows()[2]["offset"] == 1, "released at the message it cannot get past"
    assert "crashed 3 times in a row: releasing it as sick" in fleet.log_of("only")
    assert all(row["state"] == "fresh" for p, row in fleet.status_rows().items() if p != 2), "the others go on"
    assert 2 not in fleet.worker_pids("only"), "not claimed again during the cool-down"


def test_on_error_release_hands_the_partition_back_at_the_failing_message(fleet: Fleet) -> None:
    fleet.env |= {"MW_TEST_FAIL_VALUE": "11", "MW_TEST_ON_ERROR": "release"}
    fleet.start("only")
    fleet.produce(range(40))
    poll_until(lambda: fleet.status_rows()[3]["state"] == "released", timeout=30, what="partition 3 released")
    assert fleet.status_rows()[3]["offset"] == 1
    assert "11" not in fleet.counts() and "3" in fleet.counts()


def test_sigterm_past_the_shutdown_timeout_kills_a_stuck_handler_and_releases_at_its_progress(fleet: Fleet) -> None:
    fleet.env["MW_TEST_STUCK_VALUE"] = "12"  # partition 4, offset 1
    only = fleet.start("only", "--shutdown-timeout", "2s")
    fleet.produce(range(40))
    poll_until(lambda: all_handled(fleet, 39 - 3), what="everything before and beside the stuck message")
    only.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert only.wait(timeout=30) == ExitCode.OK
    assert 2 <= time.monotonic() - started < 15
    rows = fleet.status_rows()
    assert all(row["state"] == "released" for row in rows.values())
    assert rows[4]["offset"] == 1, "the stuck message is handed over, to be handled again"
    assert "shutdown_timeout (2s) passed" in fleet.log_of("only")


def test_a_second_sigterm_skips_the_wait(fleet: Fleet) -> None:
    fleet.env["MW_TEST_STUCK_VALUE"] = "12"
    only = fleet.start("only", "--shutdown-timeout", "600s")
    fleet.produce(range(40))
    poll_until(lambda: all_handled(fleet, 39 - 3), what="everything but the stuck partition")
    only.send_signal(signal.SIGTERM)
    poll_until(lambda: "SIGTERM: releasing" in fleet.log_of("only"), what="the first signal to be seen")
    only.send_signal(signal.SIGTERM)
    assert only.wait(timeout=20) == ExitCode.OK
    assert fleet.status_rows()[4] | {"heartbeat_age_s": None} == {
        "topic": fleet.topic,
        "partition": 4,
        "state": "released",
        "client": None,
        "instance": None,
        "offset": 1,
        "heartbeat_age_s": None,
        "lag": None,
        "rate": None,
        "in_flight": None,
        "call_age_s": None,
        "window_used": None,
    }


def test_sigquit_exits_at_once_without_releasing(fleet: Fleet) -> None:
    only = fleet.start("only")
    poll_until(lambda: len(fleet.worker_pids("only")) == 8, what="8 workers")
    workers = list(fleet.worker_pids("only").values())
    only.send_signal(signal.SIGQUIT)
    assert only.wait(timeout=10) == ExitCode.OK
    poll_until(lambda: all(pid_gone(pid) for pid in workers), timeout=10, what="the workers to go")
    assert {row["client"] for row in fleet.status_rows().values()} == {"only"}, "nothing was released"


def test_workers_that_cannot_start_stop_the_supervisor_instead_of_a_fork_loop(fleet: Fleet) -> None:
    fleet.env["MW_TEST_BOOT_FAILS"] = "1"
    only = fleet.start("only")
    assert only.wait(timeout=60) == ExitCode.WORKER_BOOT_ERROR
    log = fleet.log_of("only")
    assert "the database is not there" in log and "could not start" in log
    assert log.count("worker started at offset") == 0


@pytest.mark.parametrize(("mode", "batch"), [("alo", "1"), ("amo", "1"), ("amo", "0")])
def test_every_mode_handles_every_message_once_on_a_clean_run(fleet: Fleet, mode: str, batch: str) -> None:
    fleet.env |= {"MW_TEST_MODE": mode, "MW_TEST_BATCH": batch, "MW_TEST_BATCH_SIZE": "64"}
    only = fleet.start("only")
    fleet.produce(range(2000))
    poll_until(lambda: all_handled(fleet, 2000), timeout=60, what="every message")
    only.send_signal(signal.SIGTERM)
    assert only.wait(timeout=30) == ExitCode.OK
    assert set(fleet.counts().values()) == {1}
    assert {row["offset"] for row in fleet.status_rows().values()} == {250}, "released after the last message"


def test_a_worker_that_cannot_keep_up_hands_its_partition_to_a_member_that_can(fleet: Fleet) -> None:
    """A slow supervisor (20 msgs/s per worker) facing 60 msgs/s per partition releases; a fast one takes over."""
    slow = fleet.start("slow", "--max-partitions", "4", MW_TEST_DELAY="0.05")
    poll_until(lambda: len(fleet.worker_pids("slow")) == 4, what="the slow supervisor's 4 workers")
    fleet.start("fast")
    poll_until(lambda: len(fleet.worker_pids("fast")) == 4, what="the fast supervisor's 4 workers")
    slow_partitions = set(fleet.worker_pids("slow"))

    stop = threading.Event()
    sent = [0]

    def steady_stream() -> None:
        while not stop.is_set() and sent[0] < 20_000:
            fleet.produce(range(sent[0], sent[0] + 48))  # 6 per partition, every 0.1 s
            sent[0] += 48
            time.sleep(0.1)

    producer = threading.Thread(target=steady_stream, daemon=True)
    producer.start()
    try:
        poll_until(
            lambda: set(fleet.worker_pids("fast")) >= slow_partitions, timeout=60, what="the fast one to take over"
        )
    finally:
        stop.set()
        producer.join(timeout=30)
    assert "falling behind" in fleet.log_of("slow") or "stalled" in fleet.log_of("slow")
    assert "handing it over" in fleet.log_of("slow")
    poll_until(lambda: all_handled(fleet, sent[0]), timeout=60, what="every message (at least once)")
    assert not slow_partitions & set(fleet.worker_pids("slow")), "released partitions are not taken back (cool-down)"
    slow.send_signal(signal.SIGTERM)
    assert slow.wait(timeout=30) == ExitCode.OK


@pytest.mark.parametrize(
    ("limit", "reason"),
    [
        (("MARSHAL_WORKERS_MAX_MESSAGES_PER_WORKER", "30"), "max_messages_per_worker"),
        (("MARSHAL_WORKERS_MAX_MEMORY_PER_WORKER", "1MB"), "max_memory_per_worker"),
    ],
)
def test_a_worker_past_a_lifecycle_limit_restarts_cleanly_at_its_exact_offset(
    fleet: Fleet, limit: tuple[str, str], reason: str
) -> None:
    fleet.env |= {limit[0]: limit[1], "MW_TEST_DELAY": "0.005"}
    fleet.start("only")
    fleet.produce(range(800))  # 100 per partition: several restarts each
    poll_until(lambda: all_handled(fleet, 800), timeout=90, what="every message")
    assert set(fleet.counts().values()) == {1}, "a clean restart repeats nothing"
    assert fleet.log_of("only").count(reason) >= 8
    assert "restarting in" not in fleet.log_of("only"), "not counted as a crash"


def test_json_logs_and_a_state_dump_on_sigusr1(fleet: Fleet) -> None:
    only = fleet.start("only", "--log-format", "json")
    fleet.produce(range(80))
    poll_until(lambda: all_handled(fleet, 80), what="every message")
    only.send_signal(signal.SIGUSR1)
    poll_until(lambda: "state: " in fleet.log_of("only"), what="the state dump")
    lines = [orjson.loads(line) for line in fleet.log_of("only").splitlines() if line.startswith("{")]
    assert lines and len(lines) == len(fleet.log_of("only").splitlines()), "every line is one JSON object"
    assert all(line["group"] == fleet.group for line in lines if line["logger"].startswith("marshal_workers.s"))
    workers = [line for line in lines if line["logger"] == "marshal_workers.runtime.worker.worker"]
    assert {line["partition"] for line in workers} == set(range(8)) and {line["topic"] for line in workers} == {
        fleet.topic
    }
    [dump] = [line for line in lines if line["message"].startswith("state: ")]
    state = orjson.loads(dump["message"][len("state: ") :])
    assert state["phase"] == "running" and len(state["partitions"]) == 8
    assert sum(p["processed"] for p in state["partitions"]) == 80
    assert all(p["lag"] == 0 and p["next_offset"] == 10 for p in state["partitions"])


def test_sighup_releases_everything_and_restarts_the_same_process_which_claims_again(fleet: Fleet) -> None:
    total = 3000
    fleet.env["MW_TEST_DELAY"] = "0.001"
    supervisor = fleet.start("only")
    poll_until(lambda: len(fleet.worker_pids("only")) == 8, what="8 workers")
    old_workers = set(fleet.worker_pids("only").values())
    fleet.produce(range(total))
    poll_until(lambda: len(fleet.counts()) > total // 4, what="processing to be under way")

    supervisor.send_signal(signal.SIGHUP)
    poll_until(lambda: fleet.log_of("only").count(" running sink_app:app ") == 2, what="the restarted supervisor")
    poll_until(lambda: all_handled(fleet, total), timeout=60, what="every message")
    assert supervisor.poll() is None, "the same process runs on (re-executed)"
    assert not old_workers & set(fleet.worker_pids("only").values()), "with new workers"
    assert max(fleet.counts().values()) == 1, "a clean restart repeats nothing"
    log = fleet.log_of("only")
    assert "SIGHUP: releasing every partition" in log and log.count("released ") >= 8
    assert "stopped cleanly: released 8 partitions at their offsets in " in log and "s, restarting" in log

    before = fleet.log_of("only").count("worker.py")
    supervisor.send_signal(signal.SIGUSR2)  # every thread's stack: the supervisor's, then each worker's
    poll_until(lambda: fleet.log_of("only").count("worker.py") >= before + 8, what="the 8 workers' stacks")
    assert "supervisor.py" in fleet.log_of("only").split("SIGUSR2: the supervisor's threads")[-1]
    # Each worker's stacks under a heading that says whose they are.
    heading = (
        rf"SIGUSR2: stacks of worker pid (\d+), group {fleet.group}, topic {fleet.topic} partition (\d), "
        r"at offset \d+:\n"
    )
    headings = poll_until(
        lambda: len(found := re.findall(heading, fleet.log_of("only"))) == 8 and found, what="the 8 workers' headings"
    )
    assert {int(partition): int(pid) for pid, partition in headings} == fleet.worker_pids("only")
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == ExitCode.OK


def test_the_start_line_shows_the_effective_group_and_a_clean_stop_logs_a_last_line(fleet: Fleet) -> None:
    only = fleet.start("only", "--balance", "fair")  # sink_app's App() has no group: --group gives it
    poll_until(lambda: len(fleet.worker_pids("only")) == 8, what="8 workers")
    only.send_signal(signal.SIGTERM)
    assert only.wait(timeout=30) == ExitCode.OK
    lines = fleet.log_of("only").splitlines()
    started = [line for line in lines if " running sink_app:app " in line]
    assert len(started) == 1, lines[:5]
    assert f"in group {fleet.group} " in started[0] and "balance=fair" in started[0], started[0]
    assert "group=None" not in started[0] and "App(" not in started[0]
    last = [line for line in lines if "stopped" in line]
    assert len(last) == 1 and " INFO " in last[0], last
    assert f"group {fleet.group}: stopped cleanly: released 8 partitions at their offsets in " in last[0]
    assert "supervisor:" in last[0] and not [
        line for line in lines[lines.index(last[0]) + 1 :] if "supervisor:" in line
    ]


@pytest.mark.parametrize("runner", ["plain", "lanes", "shared"])
def test_handlers_say_retry_reject_or_ignore_and_the_policy_retries_only_what_it_should(
    fleet: Fleet, runner: str
) -> None:
    from test_observability import scrape, total

    from marshal_workers.kafka.embedded_broker import free_port

    fleet.app = "outcomes_app:app"
    fleet.env |= {"MW_TEST_RUNNER": runner}
    values = ["ok", "retry", "reject", "ignore", "down", "bad"]
    producer = Producer({"bootstrap.servers": fleet.brokers})
    for value in values:
        producer.produce(fleet.topic, value=value.encode(), partition=0)
    assert producer.flush(30) == 0
    port = free_port()
    fleet.start("only", "--metrics-port", str(port), "--processes", "1", MARSHAL_WORKERS_METRICS_HOST="127.0.0.1")

    # A shared handler's message that fails is delivered again (max_deliveries, 5), each delivery with its retries.
    deliveries = 5 if runner == "shared" else 1
    given_up = "MaxDeliveriesExceeded" if runner == "shared" else None
    dead = {d.value().decode(): dict(d.headers()) for d in fleet.dead_letters(3)}
    assert {value: headers["error_type"].decode() for value, headers in dead.items()} == {
        "reject": "Reject",
        "down": given_up or "ConnectionError",
        "bad": given_up or "KeyError",
    }
    poll_until(
        lambda: len(fleet.sink.read_text().splitlines()) == 2 if fleet.sink.exists() else False,
        what="the two recorded messages",
    )
    assert sorted(fleet.sink.read_text().splitlines()) == ["ok 1", "retry 3"], "retried on its third try"

    def counted() -> dict[str, float]:
        samples = scrape(port)
        return {
            "Retry": total(samples, "marshal_workers_handler_errors_total", error_type="Retry"),
            "ConnectionError": total(samples, "marshal_workers_handler_errors_total", error_type="ConnectionError"),
            "KeyError": total(samples, "marshal_workers_handler_errors_total", error_type="KeyError"),
            "retries": total(samples, "marshal_workers_handler_retries_total"),
            "ignored": total(samples, "marshal_workers_handler_outcomes_total", outcome="ignored"),
            "rejected": total(samples, "marshal_workers_handler_outcomes_total", outcome="rejected"),
        }

    expected = {
        "Retry": 2,
        "ConnectionError": 3 * deliveries,
        "KeyError": deliveries,
        "retries": 2 + 2 * deliveries,
        "ignored": 1,
        "rejected": 1,
    }
    poll_until(lambda: counted() == expected, what=f"the metrics to count {expected}")


def test_hooks_run_around_each_call_on_dead_letters_and_as_workers_take_and_leave_partitions(fleet: Fleet) -> None:
    fleet.app = "hooks_app:app"
    producer = Producer({"bootstrap.servers": fleet.brokers})
    for value in ("ok", "fail", "ignore"):
        producer.produce(fleet.topic, value=value.encode(), partition=0)
    assert producer.flush(30) == 0
    supervisor = fleet.start("only")

    def lines() -> list[str]:
        return fleet.sink.read_text().splitlines() if fleet.sink.exists() else []

    poll_until(lambda: "after ignore ignored Ignore" in lines(), what="the three messages through the hooks")
    # Every worker started before the stop: one that a SIGTERM finds not yet forked never takes its partition, and
    # runs neither hook (partition 0's three messages can be through before the last worker is forked).
    poll_until(
        lambda: sum(line.startswith("claimed") for line in lines()) == 8, what="every worker's on_partition_claimed"
    )
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=60) == 0
    found = lines()
    assert sorted(line for line in found if line.startswith("claimed")) == sorted(f"claimed {p}" for p in range(8))
    assert sorted(line for line in found if line.startswith("released")) == sorted(f"released {p}" for p in range(8))
    assert [line for line in found if not line.startswith(("claimed", "released"))] == [
        "before ok 1",
        "after ok done -",
        "before fail 1",
        "after fail failed ValueError",
        "before fail 2",
        "after fail failed ValueError",
        "dead fail ValueError",
        "before ignore 1",
        "after ignore ignored Ignore",
    ]


def niceness(pid: int) -> int:
    """A process's nice value (/proc/PID/stat, field 19)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[16])


@pytest.mark.fleet(partitions=2)
@pytest.mark.parametrize(("setting", "below"), [(None, 10), ("0", 0)])
def test_workers_run_below_their_supervisors_cpu_priority_unless_told_otherwise(
    fleet: Fleet, setting: str | None, below: int
) -> None:
    """The supervisor goes first when handlers keep every core busy: its heartbeats keep the partitions' leases."""
    env = {} if setting is None else {"MARSHAL_WORKERS_WORKER_NICE": setting}
    supervisor = fleet.start("only", **env)
    poll_until(lambda: len(fleet.worker_pids("only")) == 2, what="2 workers")
    fleet.produce(range(20))
    poll_until(lambda: all_handled(fleet, 20), what="the messages")
    expected = min(niceness(supervisor.pid) + below, 19)
    assert {niceness(pid) for pid in fleet.worker_pids("only").values()} == {expected}
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == ExitCode.OK
