"""The shutdown hooks in real processes: signals after an earlier run, under a held lock, before a long
native call, through a wrapping handler and during the exit finish; forked children.

Each test starts ``sys.executable -c script`` against a local service in this
process (the helpers of ``test_run_processes``), with a hard timeout on
everything it waits for.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from _run_helpers import Gate
from test_run_processes import finish_process, first_line, get, start, stored_episodes

from prime_traces.server import LocalTracesService

pytestmark = pytest.mark.timeout(120)

SIGNALS = pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGTERM, "crashed"), (signal.SIGINT, "cancelled")], ids=["SIGTERM", "SIGINT"]
)


@pytest.fixture
def held_uploads(service: LocalTracesService) -> Iterator[Gate]:
    """The service holds every upload until the gate opens (it opens before the service stops)."""
    gate = Gate()
    service.faults.before_upload = gate
    yield gate
    gate.open()


@SIGNALS
def test_a_run_started_after_one_finished_off_the_main_thread_is_finished_by_a_signal(
    service, tmp_path, signum, status
):
    proc = start(
        """
        import asyncio
        first = prime_runs.init("first", environments=["e"], model="m", team_id="t", finish_timeout_s=10)
        first.log_episodes(episodes("a", 2))
        # Finished on a helper thread, where signal handlers cannot be changed.
        asyncio.run(first.afinish())
        second = prime_runs.init("second", environments=["e"], model="m", team_id="t", finish_timeout_s=10)
        second.log_episodes(episodes("b", 3))
        print(first.id, second.id)
        while True:  # a training loop that never ends by itself
            sum(range(1000))
        """,
        service,
        tmp_path,
    )
    first_id, second_id = first_line(proc).split()
    proc.send_signal(signum)
    _out, err = finish_process(proc)
    assert proc.returncode == -signum, err  # still ended by the signal
    assert get(service, f"runs/{first_id}")["status"] == "completed"
    # Before the fix the first run's handler stayed and the second installed none:
    # SIGTERM left the second run "running", SIGINT let the exit hook record "crashed".
    assert get(service, f"runs/{second_id}")["status"] == status
    assert sorted(stored_episodes(service)) == ["a0", "a1", "b0", "b1", "b2"]


# A call that stays out of Python for ``seconds`` whatever signals come, as a
# collective whose peers died of the same SIGTERM does: sqlite waiting for a lock.
NATIVE_BLOCK = """
import sqlite3

def block_natively(seconds):
    # The holder stays referenced: a cycle collection in between would close it and end the block.
    holder = sqlite3.connect("held.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    sqlite3.connect("held.db", timeout=seconds, isolation_level=None).execute("BEGIN EXCLUSIVE")
    holder.close()
"""
NATIVE_BLOCK_S = 30
# Well under NATIVE_BLOCK_S: the process must not wait for the native call to return.
PROMPT_END_S = 15

LOCKED_SCRIPT = (
    NATIVE_BLOCK
    + """
import logging, signal, threading
logging.basicConfig()  # the package's warnings to stderr
run = prime_runs.init("locked", environments=["e"], model="m", team_id="t", finish_timeout_s=10)
run.log_episodes(episodes("e", 5))  # held at the service: the flush after the signal has work to do
print(run.id, flush=True)
worker = run._worker
held = {"queue": worker._queue._cond._lock, "accounting": worker.accounting._lock}[os.environ["HELD_LOCK"]]

def signal_here():
    # The signal lands inside log_episodes(), in the package's code, while it
    # holds the lock: pthread_kill to this thread runs the handler before it returns.
    assert held.locked()
    signal.pthread_kill(threading.get_ident(), getattr(signal, os.environ["SIGNAL_NAME"]))
    print("handler returned", flush=True)

class SignallingRing(list):  # the accounting's latency ring, written under its lock
    def __setitem__(self, index, value):
        signal_here()
        super().__setitem__(index, value)

def signal_then_notify(*args):  # put() calls notify() under the queue's lock (so does notify_all())
    if threading.current_thread() is threading.main_thread():
        worker._queue._cond.notify = notify
        signal_here()
    notify(*args)

if os.environ["HELD_LOCK"] == "queue":
    notify = worker._queue._cond.notify
    worker._queue._cond.notify = signal_then_notify
else:
    worker.accounting._latencies = SignallingRing(worker.accounting._latencies)
run.log_episodes(episodes("s", 1))
if os.environ.get("THEN") == "native":
    block_natively(int(os.environ["BLOCK_S"]))
while True:  # a training loop that never ends by itself
    sum(range(1000))
"""
)


@pytest.mark.parametrize("held", ["queue", "accounting"])
@SIGNALS
def test_a_signal_while_the_main_thread_holds_a_worker_lock_still_flushes_and_records_the_status(
    service, held_uploads, tmp_path, held, signum, status
):
    proc = start(LOCKED_SCRIPT, service, tmp_path, HELD_LOCK=held, SIGNAL_NAME=signal.Signals(signum).name)
    run_id = first_line(proc)
    assert proc.stdout is not None
    # Uploads stay held until this line: finishing the run cannot complete before
    # it, whatever the threads do. Before the fix the handler waited, under the
    # lock, for a finisher that needed it, until the hard timeout; then the
    # process was ended unflushed and this line never came.
    line = proc.stdout.readline().strip()
    held_uploads.open()
    _out, err = finish_process(proc)
    assert line == "handler returned", err
    assert proc.returncode == -signum, err  # ended by the signal once the run was finished
    assert get(service, f"runs/{run_id}")["status"] == status
    assert sorted(stored_episodes(service)) == [f"e{i}" for i in range(5)] + ["s0"]


def test_sigterm_under_a_lock_then_a_long_native_call_still_ends_the_process_promptly(service, held_uploads, tmp_path):
    proc = start(
        LOCKED_SCRIPT,
        service,
        tmp_path,
        HELD_LOCK="queue",
        SIGNAL_NAME="SIGTERM",
        THEN="native",
        BLOCK_S=str(NATIVE_BLOCK_S),
    )
    run_id = first_line(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    held_uploads.open()
    # The handler could not wait under the lock; the signal delivered again once
    # the run was finished is held off by the native call. Before the fix the
    # process ended only when the call returned.
    _out, err = finish_process(proc, timeout_s=PROMPT_END_S)
    assert line == "handler returned", err
    assert proc.returncode == 128 + signal.SIGTERM, err  # os._exit: the handler never ran again
    assert "did not handle SIGTERM" in err
    assert get(service, f"runs/{run_id}")["status"] == "crashed"
    assert sorted(stored_episodes(service)) == [f"e{i}" for i in range(5)] + ["s0"]


USER_CODE_SCRIPT = (
    NATIVE_BLOCK
    + """
import prime_runs._finish.signals
run = prime_runs.init("native", environments=["e"], model="m", team_id="t", finish_timeout_s=10)
run.log_episodes(episodes("e", 5))  # held at the service until the signal is sent
print(run.id, flush=True)
while prime_runs._finish.signals._handling is None:  # training, in plain user code, until the signal
    sum(range(1000))
print("back to training", flush=True)
block_natively(int(os.environ["BLOCK_S"]))
"""
)


def test_sigterm_in_user_code_ends_the_process_before_a_long_native_call(service, held_uploads, tmp_path):
    proc = start(USER_CODE_SCRIPT, service, tmp_path, BLOCK_S=str(NATIVE_BLOCK_S))
    run_id = first_line(proc)
    proc.send_signal(signal.SIGTERM)
    held_uploads.open()
    # Before the fix the handler returned at once, training went on into the
    # native call, and the signal delivered again waited for it to return.
    out, err = finish_process(proc, timeout_s=PROMPT_END_S)
    assert proc.returncode == -signal.SIGTERM, err
    assert "back to training" not in out
    assert get(service, f"runs/{run_id}")["status"] == "crashed"
    assert sorted(stored_episodes(service)) == [f"e{i}" for i in range(5)]


WRAPPED_SCRIPT = """
import signal
run = prime_runs.init("wrapped", environments=["e"], model="m", team_id="t", finish_timeout_s=10)
run.log_episodes(episodes("e", 5))
ours = signal.getsignal(signal.SIGINT)
calls = 0

def framework_handler(signum, frame):  # installed after init, chaining to ours
    global calls
    calls += 1
    ours(signum, frame)

signal.signal(signal.SIGINT, framework_handler)
try:
    print(run.id, flush=True)
    while True:  # a training loop that never ends by itself
        sum(range(1000))
except KeyboardInterrupt:
    print("framework handler calls:", calls, flush=True)
    raise
"""


def test_a_framework_handler_that_wraps_ours_runs_once_per_signal(service, tmp_path):
    proc = start(WRAPPED_SCRIPT, service, tmp_path)
    run_id = first_line(proc)
    proc.send_signal(signal.SIGINT)
    out, err = finish_process(proc)
    # Before the fix the signal was delivered again to the wrapper: one Ctrl-C acted as two.
    assert out.strip() == "framework handler calls: 1", err
    assert proc.returncode == -signal.SIGINT, err
    assert get(service, f"runs/{run_id}")["status"] == "cancelled"
    assert sorted(stored_episodes(service)) == [f"e{i}" for i in range(5)]


EXIT_SCRIPT = """
run = prime_runs.init("exiting", environments=["e"], model="m", team_id="t", finish_timeout_s=10)
run.log_episodes(episodes("e", 5))  # held at the service: the exit finish waits for them
close = run._worker.close

def announced_close(*args, **kwargs):
    print("finishing at exit", flush=True)
    return close(*args, **kwargs)

run._worker.close = announced_close
print(run.id, flush=True)
# no finish(): the exit hook finishes the run, and the signal comes meanwhile
"""


def test_sigterm_during_the_exit_finish_still_ends_the_process_by_it(service, held_uploads, tmp_path):
    proc = start(EXIT_SCRIPT, service, tmp_path)
    run_id = first_line(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    proc.send_signal(signal.SIGTERM)
    held_uploads.open()
    _out, err = finish_process(proc)
    assert line == "finishing at exit", err
    # Before the fix the exit hook the signal registered was never called (Python
    # 3.11 skips hooks registered while they run): the process exited with 0.
    assert proc.returncode == -signal.SIGTERM, err
    assert get(service, f"runs/{run_id}")["status"] == "crashed"
    assert sorted(stored_episodes(service)) == [f"e{i}" for i in range(5)]


FORK_SCRIPT = """
import threading
import requests

run = prime_runs.init("forked", environments=["e"], model="m", team_id="t", finish_timeout_s=30)
run.log_episodes(episodes("p", 2))
assert run.flush(30)
pid = os.fork()
if pid == 0:
    # The child's uploads are held until its finish begins, so what it logs is
    # still queued or in flight when it calls sys.exit(): only an exit flush
    # can deliver it.
    release = threading.Event()
    sink = run._worker.sinks[0]
    write, finish = sink.write, run.finish

    def held_write(*args, **kwargs):
        release.wait(30)
        return write(*args, **kwargs)

    def releasing_finish(*args, **kwargs):
        release.set()
        return finish(*args, **kwargs)

    sink.write, run.finish = held_write, releasing_finish
    run.log_episodes(episodes("c", 4))
    sys.exit(0)  # no finish()
_, wait_status = os.waitpid(pid, 0)
remote = requests.get(f"{os.environ['PRIME_TRACES_URL']}/api/v1/runs/{run.id}",
                      headers={"Authorization": f"Bearer {os.environ['PRIME_API_KEY']}"}, timeout=30).json()
print(run.id, os.waitstatus_to_exitcode(wait_status), remote["status"], run.status, flush=True)
run.log_episodes(episodes("q", 1))
run.finish(timeout_s=30)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_that_exits_without_finish_flushes_what_it_logged(service, tmp_path):
    proc = start(FORK_SCRIPT, service, tmp_path)
    out, err = finish_process(proc)
    assert proc.returncode == 0, err
    run_id, child_code, remote_status, local_status = out.split()
    assert child_code == "0", err
    # The child's exit did not finish the parent's run, on the service or locally.
    assert (remote_status, local_status) == ("running", "running")
    assert get(service, f"runs/{run_id}")["status"] == "completed"
    stored = stored_episodes(service)
    # Before the fix the child's records were lost with its worker thread.
    assert sorted(stored) == ["c0", "c1", "c2", "c3", "p0", "p1", "q0"], err
    assert set(stored.values()) == {1}
