"""The fork server forked from the supervisor: it must behave as the new interpreter it replaces would."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from marshal_workers.runtime.supervisor.fork_server import fork_running

ROOT = Path(__file__).resolve().parents[4]


def _wait_for_exit(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_the_forked_command_sees_only_the_fds_it_was_given_and_none_of_our_signal_handlers() -> None:
    report_r, report_w = os.pipe()
    stray_r, stray_w = os.pipe()  # open here, like a socket the supervisor holds: the child must not have it
    command = textwrap.dedent(
        f"""
        import json, os, signal
        def is_open(fd):
            try:
                os.fstat(fd)
            except OSError:
                return False
            return True
        report = {{
            "fds": [fd for fd in range(256) if is_open(fd)],
            "usr1": str(signal.getsignal(signal.SIGUSR1)),
            "int": str(signal.getsignal(signal.SIGINT)),
        }}
        os.write({report_w}, json.dumps(report).encode())
        """
    )
    # Handlers of ours, as the supervisor installs: the child must not run them.  SIGINT too, whatever this
    # process was started with (a shell's background job starts with SIGINT ignored, which a child keeps).
    previous = {signum: signal.signal(signum, lambda *_: None) for signum in (signal.SIGUSR1, signal.SIGINT)}
    try:
        pid = fork_running(sys.executable, [sys.executable, "-c", command], [report_w])
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    os.close(report_w)
    assert _wait_for_exit(pid) == 0
    with os.fdopen(report_r, "rb") as reader:
        report = json.loads(reader.read())
    for fd in (stray_r, stray_w):
        os.close(fd)
    assert set(report["fds"]) - {0, 1, 2} == {report_w}
    assert report["usr1"] == str(signal.Handlers.SIG_DFL)
    assert report["int"] == str(signal.default_int_handler)


def test_the_forked_command_exit_code_is_the_childs() -> None:
    pid = fork_running(sys.executable, [sys.executable, "-c", "raise SystemExit(7)"], [])
    assert _wait_for_exit(pid) == 7


def run_script(tmp_path: Path, script: str) -> tuple[str, str]:
    """Run ``script`` from a file (so that new interpreters find its functions) in a session of its own: whatever
    it leaves, a hung worker, its fork server, is killed with it.  Its stdout and stderr."""
    script_path = tmp_path / "script.py"
    script_path.write_text(script)
    script_process = subprocess.Popen(
        [sys.executable, str(script_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        return script_process.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(script_process.pid, signal.SIGKILL)
        script_process.wait()


def test_a_worker_of_the_forked_server_starts_processes_of_its_own_the_standard_way(tmp_path: Path) -> None:
    """The server is forked while the standard library holds its lock; a handler that starts a process of its own
    through the fork server takes that lock, and must not wait on it for ever, nor fork its worker for it."""
    script = textwrap.dedent(
        """
        import multiprocessing
        from marshal_workers.runtime.supervisor.fork_server import start_fork_server

        def grandchild(queue):
            queue.put("grandchild ran")

        def worker(queue):
            import multiprocessing.util
            queue.put(multiprocessing.util.spawnv_passfds.__module__)  # how its own helpers would start
            context = multiprocessing.get_context("forkserver")
            inner = context.Process(target=grandchild, args=(queue,))
            inner.start()
            inner.join(20)

        if __name__ == "__main__":
            context = start_fork_server("examples.quickstart:app")
            queue = context.Queue()
            process = context.Process(target=worker, args=(queue,))
            process.start()
            print(queue.get(timeout=20))
            print(queue.get(timeout=20))
            process.join(20)
            print("exit", process.exitcode)
        """
    )
    out, err = run_script(tmp_path, script)
    # A worker's own helpers are new interpreters: a fork of a worker would copy its Kafka clients' locks.
    assert out.split("\n")[:3] == ["multiprocessing.util", "grandchild ran", "exit 0"], err


def test_with_another_thread_running_the_server_is_started_the_standard_way_and_serves(tmp_path: Path) -> None:
    """Forking a process with threads copies their locks mid-use: then the server is a new interpreter."""
    script = textwrap.dedent(
        """
        import multiprocessing, multiprocessing.util, threading
        from marshal_workers.runtime.supervisor import fork_server

        def worker(queue):
            queue.put("worker ran")

        def forked(*args):
            raise AssertionError("forked with a thread running")

        if __name__ == "__main__":
            stop = threading.Event()
            threading.Thread(target=stop.wait, daemon=True).start()
            fork_server.fork_running = forked  # what _new_interpreters_forked() would install
            context = fork_server.start_fork_server("examples.quickstart:app")
            queue = context.Queue()
            process = context.Process(target=worker, args=(queue,))
            process.start()
            print(queue.get(timeout=20))
            process.join(20)
            stop.set()
        """
    )
    out, err = run_script(tmp_path, script)
    assert out.split("\n")[:1] == ["worker ran"], err
