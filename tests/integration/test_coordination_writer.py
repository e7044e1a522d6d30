"""The coordinator against a real broker: races, staleness, releases, zombies, garbage."""

from __future__ import annotations

import logging
import random
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import replace

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from kafka_proxy import CREATE_TOPICS, KafkaProxy
from polling import poll_until

from marshal_workers.core.config import Settings
from marshal_workers.errors import CoordinationTopicError, CoordinationWriteError, KafkaUnavailable
from marshal_workers.kafka.coordination_reader import drain, read_group_state
from marshal_workers.kafka.coordination_writer import Coordinator, message_claim_verdicts
from marshal_workers.kafka.embedded_broker import EmbeddedBroker, free_port
from marshal_workers.protocol.member_id import MemberId

pytestmark = pytest.mark.broker


@pytest.fixture
def coordinators(as_client: Callable[[str], Settings]) -> Iterator[Callable[[str], Coordinator]]:
    """Start coordinators by client id; all are closed when the test ends."""
    with ExitStack() as stack:
        yield lambda client_id: stack.enter_context(Coordinator(as_client(client_id)))


def me(coordinator: Coordinator) -> MemberId:
    return MemberId(coordinator.client, coordinator.instance)


def test_missing_coordination_topic_is_created_with_the_configured_partitions(settings: Settings) -> None:
    with Coordinator(settings) as coordinator:
        assert coordinator.partition_count == settings.coordination_partitions
    metadata = AdminClient({"bootstrap.servers": settings.brokers}).list_topics(timeout=10)
    assert len(metadata.topics[settings.coordination_topic].partitions) == settings.coordination_partitions


def test_the_metadata_a_coordinator_found_is_kept_for_the_first_look_once_it_lists_the_topic(
    settings: Settings,
) -> None:
    with Coordinator(settings) as first:
        assert first.take_first_metadata() is None, "asked before the coordination topic was made: it is not in it"
    with Coordinator(settings) as second:
        found = second.take_first_metadata()
        assert found is not None
        assert len(found.topics[settings.coordination_topic].partitions) == settings.coordination_partitions
        assert second.take_first_metadata() is None, "handed over once, not kept"


def test_four_coordinators_racing_for_64_partitions_end_with_one_agreed_owner_each(
    coordinators: Callable[[str], Coordinator], unique: str
) -> None:
    members = [coordinators(f"racer-{i}") for i in range(4)]
    topic, partitions = f"orders-{unique}", range(64)
    won: dict[str, list[int]] = {m.client: [] for m in members}
    start = threading.Barrier(len(members))

    def race(member: Coordinator) -> None:
        order = list(partitions)
        random.Random(member.client).shuffle(order)
        start.wait()
        # No look before leaping: every member claims every partition, so each one is contested.
        won[member.client] = [p for p in order if member.claim(topic, p)]

    threads = [threading.Thread(target=race, args=(m,)) for m in members]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    winners = sorted(p for claimed in won.values() for p in claimed)
    assert winners == list(partitions), "every partition is won exactly once"
    assert sum(1 for claimed in won.values() if claimed) >= 2, "the race was real: more than one member won something"

    def owner_maps() -> list[dict[int, MemberId | None]]:
        return [{p: m.world().owner(topic, p) for p in partitions} for m in members]

    agreed = poll_until(
        lambda: (maps := owner_maps()) and all(x == maps[0] for x in maps) and maps[0], what="agreement"
    )
    by_client = {m.client: me(m) for m in members}
    assert agreed == {p: by_client[c] for c, claimed in won.items() for p in claimed}


def test_a_stale_owner_is_taken_over_after_two_heartbeats_and_not_before(
    coordinators: Callable[[str], Coordinator], settings: Settings, unique: str
) -> None:
    topic, hb_ms = f"orders-{unique}", settings.heartbeat_ms
    owner, taker = coordinators("owner"), coordinators("taker")
    assert owner.claim(topic, 0)
    assert owner.heartbeat(topic, 0, 10)
    last_heartbeat = owner.world().get(topic, 0).last_ts  # type: ignore[union-attr]

    assert not taker.claim(topic, 0), "a fresh owner keeps its partition"
    poll_until(lambda: taker.now_ms() > last_heartbeat + hb_ms * 1.5, what="1.5 HB to pass")
    assert not taker.claim(topic, 0), "an owner silent for less than 2*HB keeps its partition"

    poll_until(lambda: taker.claim(topic, 0), timeout=2 * hb_ms / 1000 + 10, interval=0.1, what="take-over")
    state = taker.world().get(topic, 0)
    assert state is not None and state.owner == me(taker)
    assert state.last_ts - last_heartbeat > 2 * hb_ms
    assert state.resume_offset == 10, "the new owner resumes where the stale one last reported"
    assert not owner.heartbeat(topic, 0, 11), "the old owner's heartbeat is refused after the take-over"


def test_a_release_makes_the_partition_claimable_at_once_with_its_offset(
    coordinators: Callable[[str], Coordinator], unique: str
) -> None:
    topic = f"orders-{unique}"
    first, second = coordinators("first"), coordinators("second")
    assert first.claim(topic, 3) and first.heartbeat(topic, 3, 10)
    assert first.release(topic, 3, 42)
    poll_until(lambda: second.world().owner(topic, 3) is None and second.world().get(topic, 3), what="release seen")
    assert second.claim(topic, 3), "no wait for staleness after a clean release"
    assert second.world().get(topic, 3).resume_offset == 42  # type: ignore[union-attr]


def test_a_heartbeat_from_a_non_owner_is_ignored_by_every_reader(
    coordinators: Callable[[str], Coordinator], unique: str
) -> None:
    topic = f"orders-{unique}"
    owner, intruder, bystander = coordinators("owner"), coordinators("intruder"), coordinators("bystander")
    assert owner.claim(topic, 0) and owner.heartbeat(topic, 0, 5)
    assert not intruder.heartbeat(topic, 0, 999)
    assert intruder.claim(topic, 1)  # a later record on the same log: once seen, the heartbeat was folded too
    for reader in (owner, intruder, bystander):
        poll_until(
            lambda reader=reader: reader.world().owner(topic, 1) == me(intruder), what="the intruder's later claim"
        )
        state = reader.world().get(topic, 0)
        assert state is not None and state.owner == me(owner) and state.offset == 5


def test_claim_messages_advances_the_resume_point_for_the_next_owner(
    coordinators: Callable[[str], Coordinator], unique: str
) -> None:
    topic = f"orders-{unique}"
    first, second = coordinators("first"), coordinators("second")
    assert first.claim(topic, 0) and first.heartbeat(topic, 0, 100)
    assert first.claim_messages(topic, 0, 600)
    assert not second.claim_messages(topic, 0, 700), "only the owner may claim messages"
    assert first.release(topic, 0, 100)  # e.g. the batch was in flight when the worker died
    assert poll_until(lambda: second.claim(topic, 0), what="claim after release")
    assert second.world().get(topic, 0).resume_offset == 600  # type: ignore[union-attr]


def test_release_group_pauses_the_group_and_lets_the_operator_set_positions(
    coordinators: Callable[[str], Coordinator], unique: str
) -> None:
    topic = f"orders-{unique}"
    member, operator = coordinators("member"), coordinators("operator")
    assert member.claim(topic, 0) and member.heartbeat(topic, 0, 50)
    assert operator.release_group(operator.now_ms() + 3000)
    assert not member.heartbeat(topic, 0, 51), "the pause dropped every owner"
    assert not member.claim(topic, 0), "claims are refused during the pause"
    assert operator.release(topic, 0, 7), "the pausing client sets the position"
    assert not member.release(topic, 0, 9)
    assert poll_until(lambda: member.claim(topic, 0), timeout=15, interval=0.2, what="the pause to end")
    assert member.world().get(topic, 0).resume_offset == 7  # type: ignore[union-attr]


def test_garbage_on_the_coordination_topic_is_skipped_and_counted(
    coordinators: Callable[[str], Coordinator], settings: Settings, unique: str
) -> None:
    topic = f"orders-{unique}"
    member = coordinators("member")
    assert member.claim(topic, 0)
    producer = Producer({"bootstrap.servers": settings.brokers})
    junk = [b"\xff\xfe", b"not json", b"{}", b'{"v":1,"type":"claim"}', b"[1,2]", None]
    for partition in range(member.partition_count):
        for value in junk:
            producer.produce(settings.coordination_topic, value=value, partition=partition)
    producer.flush(10)
    assert member.heartbeat(topic, 0, 1), "the coordinator keeps working past garbage"
    poll_until(lambda: member.garbage_seen == len(junk) * member.partition_count, what="garbage counted")
    assert member.world().owner(topic, 0) == me(member)

    with Coordinator(replace(settings, client_id="late")) as late:  # a reader that starts after the garbage
        assert late.garbage_seen == len(junk) * member.partition_count
        assert late.world().get(topic, 0).offset == 1  # type: ignore[union-attr]


def test_an_unreachable_broker_fails_fast_with_a_clear_error(settings: Settings) -> None:
    unreachable = replace(settings, brokers=f"127.0.0.1:{free_port()}", connect_timeout=2.0)
    started = time.monotonic()
    with pytest.raises(KafkaUnavailable, match="did not answer within 2s"):
        Coordinator(unreachable).start()
    assert time.monotonic() - started < 10


def test_a_coordination_topic_that_cannot_be_created_is_a_clear_error(settings: Settings) -> None:
    """A cluster that will not create topics (played by a proxy that hangs up on CreateTopics)."""
    proxy_port = free_port()
    with EmbeddedBroker(advertised=f"127.0.0.1:{proxy_port}") as broker:
        assert broker.port is not None
        proxy = KafkaProxy(proxy_port, broker.port, refuse=frozenset({CREATE_TOPICS})).start()
        try:
            refusing = replace(settings, brokers=f"127.0.0.1:{proxy_port}", connect_timeout=3.0)
            started = time.monotonic()
            with pytest.raises(CoordinationTopicError, match="could not be created.*Create it"):
                Coordinator(refusing).start()
            assert time.monotonic() - started < 15
            assert proxy.refused >= 1
        finally:
            proxy.close()


def test_coordinators_recover_when_the_broker_is_frozen_for_a_while(settings: Settings, unique: str) -> None:
    """SIGSTOP the broker for longer than 2*HB, then SIGCONT: writes fail cleanly, then work again."""
    topic = f"orders-{unique}"
    with EmbeddedBroker() as broker, ExitStack() as stack:
        frozen = replace(settings, brokers=broker.bootstrap, write_timeout=3.0)
        first = stack.enter_context(Coordinator(replace(frozen, client_id="first")))
        second = stack.enter_context(Coordinator(replace(frozen, client_id="second")))
        assert first.claim(topic, 0) and second.claim(topic, 1)

        broker.pause()
        try:
            started = time.monotonic()
            with pytest.raises(CoordinationWriteError):
                first.heartbeat(topic, 0, 5)
            assert time.monotonic() - started < 10, "a write to a frozen broker fails within its timeout"
            time.sleep(1.0)  # keep it frozen past 2*HB in all
        finally:
            broker.resume()

        def heartbeat_goes_through() -> bool:
            try:
                return first.heartbeat(topic, 0, 6)
            except CoordinationWriteError:
                return False

        poll_until(heartbeat_goes_through, timeout=60, interval=0.2, what="writes to work again")
        assert second.claim(topic, 2)
        for reader in (first, second):
            poll_until(
                lambda reader=reader: reader.world().owner(topic, 2) == me(second),
                timeout=30,
                what="both tails to go on",
            )
            assert reader.world().owner(topic, 0) == me(first)
            assert reader.world().get(topic, 0).offset == 6  # type: ignore[union-attr]


def test_a_failed_write_replaces_the_producer_once_and_later_writes_go_through(settings: Settings, unique: str) -> None:
    """Regression (issue 9): after one write timed out, the failures of the writes that the producer
    replacement purged replaced the new producer in turn, purging the writes made since: with AMO
    claims always in flight, no verdict came for seconds.  A purged write now fails at once, alone."""
    topic = f"orders-{unique}"
    with EmbeddedBroker() as broker:
        # HB 5s: the freeze stays well within 2*HB, so the claims are accepted once they get through.
        frozen = replace(settings, brokers=broker.bootstrap, write_timeout=2.0, heartbeat_interval=5.0)
        with Coordinator(frozen) as coordinator:
            assert coordinator.claim(topic, 0)
            broker.pause()
            try:
                timed_out = coordinator.submit(coordinator.message_claims([(topic, 0, 10)]))
                purged = coordinator.submit(coordinator.message_claims([(topic, 0, 20)]))
                # Our deadline passes now; librdkafka's own timeout (the same 2 s) must not fire first, or
                # the write would fail as timed out by the client instead of being given up by us.
                timed_out.deadline = time.monotonic()
                with pytest.raises(CoordinationWriteError, match="did not confirm"):
                    coordinator.collect(timed_out)  # replaces the producer, purging the other one
                after = coordinator.submit(coordinator.message_claims([(topic, 0, 30)]))
                with pytest.raises(CoordinationWriteError, match="PURGE"):
                    coordinator.collect(purged)  # fails at once, and must not replace the new producer
            finally:
                broker.resume()
            verdicts = poll_until(lambda: coordinator.collect(after), timeout=30, what="the write made after")
            assert message_claim_verdicts([(topic, 0, 30)], verdicts) == [True]
            assert coordinator.world().get(topic, 0).amo_offset == 30  # type: ignore[union-attr]


def test_verdicts_of_a_lone_writer_come_from_its_delivery_reports_and_every_reader_agrees(
    coordinators: Callable[[str], Coordinator], settings: Settings, unique: str
) -> None:
    """The AMO fast path (issue 11): with everything before its record folded, a writer folds its record from
    the delivery report instead of waiting to read it back; the tail then skips it.  Its state must be the
    one every other reader folds from the log."""
    topic = f"payments-{unique}"
    writer = coordinators("fast")
    assert writer.claim(topic, 0) and writer.claim(topic, 1)
    for end in range(1, 101):
        assert message_claim_verdicts(
            [(topic, 0, end), (topic, 1, 2 * end)],
            writer.write(writer.message_claims([(topic, 0, end), (topic, 1, 2 * end)])),
        ) == [True, True]
    assert writer.early_verdicts > 50, "most verdicts came from the delivery report"
    assert not writer.claim_messages(topic, 2, 10), "a partition we do not own: refused on the fast path too"
    mine = writer.world()
    other = read_group_state(settings, settings.require_group())
    assert other.partitions == mine.partitions
    assert (mine.get(topic, 0).amo_offset, mine.get(topic, 1).amo_offset) == (100, 200)  # type: ignore[union-attr]


def test_a_loop_that_waits_only_on_own_folds_is_woken_for_every_verdict(
    coordinators: Callable[[str], Coordinator], unique: str
) -> None:
    """The supervisor's loop: wait on own_folds(), drain it, collect().  The wake once came from inside the
    delivery callback, before the delivery was marked done: a loop that woke then drained the wake, saw the
    write still pending, and slept until its next tick (AMO claims waited a tick each).  Here the loop has no
    tick: a write whose verdict does not wake it within the write timeout is a lost wake-up."""
    coordinator = coordinators("waiter")
    own_folds = coordinator.own_folds()
    topic = f"orders-{unique}"
    for partition in range(200):
        pending = coordinator.submit([coordinator.claim_record(topic, partition)])
        while (verdicts := coordinator.collect(pending)) is None:
            woken, _, _ = select.select([own_folds], [], [], coordinator.settings.write_timeout + 5)
            assert woken, f"the verdict of write {partition} never woke the loop"
            drain(own_folds)
        assert verdicts == [True]


def test_a_coordination_topic_kept_for_ever_is_warned_about(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    from confluent_kafka.admin import NewTopic

    admin = AdminClient({"bootstrap.servers": settings.brokers})
    topic = NewTopic(settings.coordination_topic, num_partitions=1, config={"retention.ms": "-1"})
    admin.create_topics([topic])[settings.coordination_topic].result(10)
    caplog.set_level(logging.WARNING, logger="marshal_workers.kafka.coordination_writer")
    with Coordinator(settings):
        # Checked beside the start-up, not before it: the warning may come just after.
        poll_until(lambda: "keeps its records for ever" in caplog.text, timeout=30, what="the retention warning")
    assert "coordination_retention" in caplog.text  # what to set
