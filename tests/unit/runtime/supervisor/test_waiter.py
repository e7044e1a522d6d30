"""The supervisor's Waiter: readable objects only, the object asked for (even on a reused descriptor)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os

from marshal_workers.runtime.supervisor.waiter import Waiter


def test_it_reports_only_the_readable_pipes_and_nothing_after_a_timeout() -> None:
    waiter = Waiter()
    (a_read, a_write), (b_read, b_write) = multiprocessing.Pipe(duplex=False), multiprocessing.Pipe(duplex=False)
    try:
        assert waiter.wait([a_read, b_read], timeout=0.01) == set()
        b_write.send(1)
        assert waiter.wait([a_read, b_read], timeout=1) == {b_read}
        assert b_read.recv() == 1
        assert waiter.wait([a_read, b_read], timeout=0.01) == set()
    finally:
        waiter.close()
        for end in (a_read, a_write, b_read, b_write):
            end.close()


def test_an_object_left_out_of_a_wait_is_not_reported() -> None:
    waiter = Waiter()
    read, write = multiprocessing.Pipe(duplex=False)
    other_read, other_write = multiprocessing.Pipe(duplex=False)
    try:
        write.send("x")
        assert waiter.wait([read], timeout=1) == {read}
        assert waiter.wait([other_read], timeout=0.01) == set()  # read is still readable, but not asked for
    finally:
        waiter.close()
        for end in (read, write, other_read, other_write):
            end.close()


def test_a_descriptor_closed_and_reused_reports_the_new_object_not_the_old() -> None:
    waiter = Waiter()
    old_read, old_write = multiprocessing.Pipe(duplex=False)
    assert waiter.wait([old_read], timeout=0.01) == set()
    number = old_read.fileno()
    old_read.close()
    old_write.close()
    new_read, new_write = multiprocessing.Pipe(duplex=False)
    spare = None
    try:
        if new_read.fileno() != number:  # make the new pipe's read end take the old number
            spare = os.dup(new_read.fileno())
            os.dup2(new_read.fileno(), number)
            new_read.close()
            new_read = multiprocessing.connection.Connection(number, writable=False)
        new_write.send(2)
        assert waiter.wait([new_read], timeout=1) == {new_read}
    finally:
        waiter.close()
        new_read.close()
        new_write.close()
        if spare is not None:
            os.close(spare)


def test_a_process_sentinel_is_reported_once_the_process_has_exited() -> None:
    waiter = Waiter()
    process = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    process.start()
    try:
        ready: set[object] = set()
        for _ in range(100):  # the exit takes a moment; the wait itself returns as soon as it happens
            ready = waiter.wait([process.sentinel], timeout=1)
            if ready:
                break
        assert ready == {process.sentinel}
    finally:
        process.join(10)
        waiter.close()
