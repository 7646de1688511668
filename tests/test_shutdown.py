"""The shutdown hooks in real processes: signals after an earlier run, signals under a held lock, forked children.

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
        first = prime_runs.init("first", finish_timeout_s=10)
        first.log_episodes(episodes("a", 2))
        # Finished on a helper thread, where signal handlers cannot be changed.
        asyncio.run(first.afinish())
        second = prime_runs.init("second", finish_timeout_s=10)
        second.log_episodes(episodes("b", 3))
        print(first.id, second.id)
        while True:  # a training loop that never ends by itself
            sum(range(1000))
        """,
        service, tmp_path,
    )  # fmt: skip
    first_id, second_id = first_line(proc).split()
    proc.send_signal(signum)
    _out, err = finish_process(proc)
    assert proc.returncode == -signum, err  # still ended by the signal
    assert get(service, f"runs/{first_id}")["status"] == "completed"
    # Before the fix the first run's handler stayed and the second installed none:
    # SIGTERM left the second run "running", SIGINT let the exit hook record "crashed".
    assert get(service, f"runs/{second_id}")["status"] == status
    assert sorted(stored_episodes(service)) == ["a0", "a1", "b0", "b1", "b2"]


LOCKED_SCRIPT = """
import signal, threading
run = prime_runs.init("locked", finish_timeout_s=10)
run.log_episodes(episodes("e", 5))  # held at the service: the flush after the signal has work to do
print(run.id, flush=True)
held = {"queue": run._worker._queue._cond, "accounting": run._worker.accounting._lock}[os.environ["HELD_LOCK"]]
with held:
    # As if the signal landed inside log_episodes(): pthread_kill to this thread
    # runs the handler before it returns, with the lock still held.
    signal.pthread_kill(threading.get_ident(), getattr(signal, os.environ["SIGNAL_NAME"]))
    print("handler returned", flush=True)
while True:  # a training loop that never ends by itself
    sum(range(1000))
"""


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
    assert sorted(stored_episodes(service)) == [f"e{i}" for i in range(5)]


FORK_SCRIPT = """
import threading
import requests

run = prime_runs.init("forked", finish_timeout_s=30)
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
