"""``Run``: the handle a training script logs through."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prime_runs._console.console import Console
from prime_runs._finish.exit_hooks import finishing_at_exit
from prime_runs._finish.finisher import Finisher
from prime_runs._history.lane import MetricsLane
from prime_runs._history.values import History, flatten, to_wire
from prime_runs._history.values import row as metric_row
from prime_runs._local.run_file import RunFile
from prime_runs._local.rundir import RunDirectory
from prime_runs._records.sink import Sink
from prime_runs._records.size_meter import SizeMeter
from prime_runs._service.ownership import ENV_RUN_ID, ENV_RUN_KIND
from prime_runs._service.platform_runs import RunSpec
from prime_runs._service.state import RunState
from prime_runs._service.updates import RunUpdates
from prime_runs._upload.settings import WorkerSettings
from prime_runs._upload.worker import UploadWorker
from prime_runs.errors import PrimeRunsError, SinkError
from prime_runs.models import CONFIG_SOURCE_KEY, ConfigSource, RunStatus
from prime_traces.threads import call_in_forked_child

logger = logging.getLogger(__name__)

ON_ERROR = ("warn", "raise")
#: How long ``flush()`` waits by default.
DEFAULT_FLUSH_TIMEOUT_S = 30.0
_UNSET: Any = object()


class Run:
    """One run: ``log_episodes`` never blocks; ``finish`` is bounded.

    Made by :func:`prime_runs.init`. ``log_episodes`` / ``log_traces`` hand
    records to a background worker and return at once (``False`` means the
    queue was full and the records were dropped, and counted). ``flush`` and
    ``finish`` wait at most their timeout; ``finish`` is idempotent and
    thread-safe, and an unfinished run is finished as ``crashed`` at exit.
    What the service did not take by then is in the run directory, ``dir``,
    for ``prime-runs sync`` to upload.

    Usage::

        with prime_runs.init("grpo-math", kind="train") as run:
            run.log_episodes(episodes)
            run.log({"reward": 0.7}, step=3)
    """

    def __init__(
        self,
        *,
        run_id: str,
        name: str | None,
        kind: str,
        mode: str,
        url: str | None,
        state: RunState,
        owner: bool,
        on_error: str,
        finish_timeout_s: float,
        handle_signals: bool,
        console: Console,
        sinks: Sequence[Sink] | None = None,
        worker_settings: WorkerSettings | None = None,
        size_meter: SizeMeter | None = None,
        updates: RunUpdates | None = None,
        metrics: MetricsLane | None = None,
        tags: list[str] | None = None,
        rundir: RunDirectory | None = None,
        service_url: str | None = None,
        attached: bool = False,
        spec: RunSpec | None = None,
        platform_url: str | None = None,
        release: Callable[[], Any] | None = None,
    ) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be 'warn' or 'raise', not {on_error!r}")
        self.id = run_id
        self.name = name
        self.kind = kind
        self.mode = mode
        self.url = url
        #: The run directory (created only when something is kept there, online).
        self.dir = rundir.path if rundir is not None else None
        self.tags = list(tags or [])
        #: What the run says on the terminal (``init(console=...)``).
        self.console = console
        #: The history of the first metrics logged, for the sparklines of the finish summary.
        self.history = History()
        self._state = state
        self._service_url = service_url
        self._attached = attached
        self._spec = spec
        self._platform_url = platform_url
        self._errors: list[str] = []
        self._worker = (
            UploadWorker(
                sinks,
                worker_settings,
                size_meter=size_meter,
                on_error=self._note_error,
                on_loss=console.count_loss,
                tick=self._tick,
            )
            if sinks is not None
            else None
        )
        self._updates = updates
        if updates is not None:
            updates.on_failure = self._note_failure
        self._metrics = metrics
        if metrics is not None:
            metrics.on_lost = self._forget_rows  # the summary's sparklines show only rows that were kept
        self._on_error = on_error
        #: This process's record files closed whole, ``{name: [bytes, lines]}``: a sync tells damage from a tear.
        self._sealed_files: Callable[[], dict[str, list[int]]] = dict
        self._next_step = 0
        self._first_error: SinkError | None = None
        self._finisher = Finisher(
            run_id,
            name=name,
            mode=mode,
            directory=self.dir,
            kind=kind,
            state=state,
            stats=self.stats,
            console=console,
            timeout_s=finish_timeout_s,
            on_hook=self._finish_from_hook,
            handle_signals=handle_signals,
            owner=owner,
            worker=self._worker,
            metrics=metrics,
            updates=updates,
            run_file=RunFile(rundir, self._document) if rundir is not None and owner else None,
            history=self.history,
            release=release,
        )
        if mode != "disabled":
            self._finisher.install()
        call_in_forked_child(self._after_fork_in_child)
        if self._worker is not None:
            # Now rather than in the first log_episodes(): that call would wait for the thread to start
            # (0.4-1.7 ms, where a call that only queues takes 0.1).
            self._worker.start()

    def __repr__(self) -> str:
        return f"Run(id={self.id!r}, name={self.name!r}, mode={self.mode!r}, status={self.status!r})"

    @property
    def config(self) -> dict[str, Any]:
        """The run's config, from ``init(config=...)`` and ``update_config``; what it holds at finish is sent."""
        return self._state.config

    @config.setter
    def config(self, value: Mapping[str, Any]) -> None:
        with self._state.lock:
            self._state.config = dict(value)
        self._state.unsent(config=True, summary=False)
        self._changed()

    @property
    def summary(self) -> dict[str, Any]:
        """The last value of each metric logged, and what ``update_summary`` / ``finish`` merged in."""
        return self._state.summary

    @summary.setter
    def summary(self, value: Mapping[str, Any]) -> None:
        with self._state.lock:
            self._state.summary = dict(value)
        self._state.unsent(config=False, summary=True)
        self._changed()

    @property
    def status(self) -> RunStatus:
        """``RunStatus.RUNNING``, then the terminal status, set as ``finish()`` starts (the first call's wins)."""
        return self._state.status

    @property
    def finished(self) -> bool:
        """Whether ``finish()`` has completed (``status`` turns terminal as it starts)."""
        return self._finisher.finished.is_set()

    @property
    def attached(self) -> bool:
        """Whether this online run was attached to by id (created by someone else) rather than created here."""
        return self._attached

    @property
    def errors(self) -> list[str]:
        """What went wrong without raising, one line each: ``"<what> failed: <Type>: <message>"``."""
        return list(self._errors)

    @property
    def config_source(self) -> ConfigSource | None:
        """The config file the run was started from (``init(config=path)``), if any."""
        source = self._state.config.get(CONFIG_SOURCE_KEY)
        return ConfigSource.from_mapping(source) if isinstance(source, Mapping) else None

    @property
    def error(self) -> str | None:
        """The error the run finished with, if any."""
        return self._state.error

    @property
    def finish_timeout_s(self) -> float:
        """How long ``finish()`` waits by default (``init(finish_timeout_s=...)``); settable."""
        return self._finisher.timeout_s

    @finish_timeout_s.setter
    def finish_timeout_s(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"finish_timeout_s must be at least 0, not {value}")
        self._finisher.timeout_s = value

    # -- logging (never blocks) ----------------------------------------------

    def log_episodes(self, records: Iterable[Any]) -> bool:
        """Queue episode envelopes; ``False`` means they were dropped (never blocks)."""
        return self._submit(records, "episode")

    def log_traces(self, records: Iterable[Any]) -> bool:
        """Queue bare traces; ``False`` means they were dropped (never blocks)."""
        return self._submit(records, "trace")

    def _submit(self, records: Iterable[Any], line_format: str) -> bool:
        if self._worker is None:
            return True
        if self._finisher.finishing:
            method = "log_episodes" if line_format == "episode" else "log_traces"
            self.console.warn_once(
                "late-records",
                "%s() was called after finish() of run %s: its records are not logged (counted as dropped: closed)",
                method,
                self.id,
            )
        # After finish() the worker refuses (and counts) the records: never raise into training.
        return self._worker.submit(records, line_format=line_format)

    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Append a row to the run's metrics history and update the summary's last values.

        Nested dicts flatten with ``/`` (``train/loss``), keys become strings,
        numpy / torch scalars (anything with ``.item()``) become numbers, and
        NaN and the infinities are kept. A value that is not a scalar is left
        out with one warning naming it; the rest of the row is logged. Without
        ``step`` the row gets the run's next step (one past the highest so
        far). Never blocks and never raises for a value: rows go to the
        service on a lane of their own, at most every second.
        """
        if self._finisher.finishing:
            self.console.warn_once(
                "late-log",
                "run.log() was called after finish() of run %s: the values are kept in run.summary but not sent",
                self.id,
            )
        values, refused = flatten(metrics) if isinstance(metrics, Mapping) else ({}, ["the metrics (not a mapping)"])
        for what in refused:
            logger.warning("run.log(): %s is not logged; the rest of the row is", what)
            self.console.warn_once(f"metric:{what}", "run.log(): %s is not logged; the rest of the row is", what)
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            self.console.warn_once(
                "metric-step", "run.log(): step=%r is not an integer; the run's next step is used", step
            )
            step, given = None, False
        else:
            given = step is not None
        state = self._state
        with state.lock:
            row_step = self._next_step if step is None else step
            self._next_step = max(self._next_step, row_step + 1)
            state.summary.update({name: to_wire(value) for name, value in values.items()})
            if given:
                state.summary["step"] = row_step
            state.summary_changed()
            self.history.add(row_step, values)
        if values and self._metrics is not None:
            self._metrics.add(metric_row(row_step, time.time(), values))
        self._changed()

    def _forget_rows(self, rows: list[dict[str, Any]]) -> None:
        with self._state.lock:
            self.history.discard({row["step"] for row in rows})

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """The published SDK's name for :meth:`log`."""
        self.log(metrics, step=step)

    def update_summary(self, values: Mapping[str, Any]) -> None:
        """Merge ``values`` into the summary (sent on a timer and at finish); no history row."""
        self._state.merge_summary(values)
        self._changed()

    def update_config(self, values: Mapping[str, Any]) -> None:
        """Merge ``values`` into the config (sent on a timer and at finish)."""
        self._state.merge_config(values)
        self._changed()

    def _changed(self) -> None:
        run_file = self._finisher.run_file
        if run_file is not None:
            run_file.dirty = True
        # The worker thread also runs the update timer: start it for runs that
        # log metrics before (or without) any episode.
        if self._worker is not None and self._finisher.owner:
            self._worker.start()

    def send_updates(self, timeout_s: float | None = None) -> None:
        """Send pending config and summary changes now (the worker's timer calls this)."""
        if self._updates is not None and self._finisher.owner:
            self._updates.send_changes(timeout_s)

    def _tick(self) -> None:
        """The worker's timer: send what changed (on a helper), and keep ``run.json`` current."""
        if self._updates is not None and self._worker is not None and self._finisher.owner:
            # Bounded as a whole by the interval; one still waiting makes the next ticks skip.
            self._updates.send_changes_in_background(self._worker.settings.tick_interval_s)
        run_file = self._finisher.run_file
        if run_file is not None:
            run_file.save_if_dirty()

    def _keep_locally(self) -> None:
        """Start keeping ``run.json`` (offline runs, ``save_local``); the owner only."""
        run_file = self._finisher.run_file
        if run_file is not None and not run_file.activate():
            self._finisher.run_file = None

    def _directory_needed(self, _path: str) -> None:
        # Online, the run directory appears with the first record kept there.
        self._keep_locally()

    def _document(self) -> dict[str, Any] | None:
        """What ``run.json`` holds: the run as the service would have it, and the counters."""
        copies = self._state.copies()
        if copies is None:
            return None  # a signal's finisher interrupted log(): the next write has it all
        config, summary = copies
        state = self._state
        return {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "mode": self.mode,
            "tags": self.tags,
            "config": config,
            "summary": summary,
            "status": state.status,
            "error": state.error,
            "service_url": self._service_url,
            "platform_url": self._platform_url,
            "url": self.url,
            "finished_at": state.finished_at,
            "attached": self._attached,
            "spec": self._spec.to_dict() if self._spec is not None else None,
            "counters": self.stats(),
            "sealed_files": self._sealed_files(),
        }

    # -- waiting (bounded) ---------------------------------------------------

    def flush(self, timeout: float | None = DEFAULT_FLUSH_TIMEOUT_S, *, timeout_s: Any = _UNSET) -> bool:
        """Wait until everything logged before the call (records and metrics rows) is stored or accounted for.

        Returns whether it all was within ``timeout`` (seconds; ``timeout_s`` is
        the same; ``None`` waits as long as it takes). Under
        ``on_error="raise"`` the first failure is raised here, once.
        """
        if timeout_s is not _UNSET:
            timeout = timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        done = self._worker.flush(timeout) if self._worker is not None else True
        if self._metrics is not None:
            done = self._metrics.flush(deadline) and done
        self._raise_first_error()
        return done

    def finish(
        self,
        summary: Mapping[str, Any] | None = None,
        *,
        status: RunStatus | str = RunStatus.COMPLETED,
        error: str | BaseException | None = None,
        timeout: float | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Flush, then record the terminal status; returns within ``timeout`` (+1 s).

        ``summary`` is merged into the run's summary first; ``status`` is a
        terminal :class:`RunStatus` (or its string), ``error`` the reason a run
        did not complete. ``timeout`` (or ``timeout_s``) defaults to the run's
        ``finish_timeout``. What the service did not take by then is written to
        the run directory within ``spill_timeout_s`` more (see
        :func:`prime_runs.init`), and the console says where and how to upload
        it with ``prime-runs sync``.

        Idempotent and thread-safe: the first call finishes and its status wins;
        later ones wait for it (within their own timeout) and return.

        Raises:
            ValueError: ``status`` is not a terminal status (the run is not finished then).
        """
        resolved = RunStatus(status)
        if not resolved.is_terminal():
            raise ValueError(f"finish() requires a terminal status, got {resolved.value!r}")
        wait = timeout if timeout is not None else timeout_s
        before = (lambda: self.update_summary(summary)) if summary else None
        if self._finisher.finish(resolved, _describe(error), wait, before=before):
            self._raise_first_error()  # only the call that finished: one that waited for it raises nothing

    def _finish_from_hook(self, status: str) -> None:
        if not self._finisher.finishing:
            # A signal (a preemption) may be followed by SIGKILL: to disk first. At exit without finish()
            # there is no such hurry, and Python 3.12+ starts no thread then to upload from disk after.
            self._finisher.disk_first = not finishing_at_exit()
            if status == RunStatus.CRASHED:
                logger.warning("run %s was never finished; reporting it as crashed", self.id)
            error = "process exited without finishing the run" if status == RunStatus.CRASHED else "interrupted"
            try:
                self.finish(status=status, error=error)
            except PrimeRunsError as err:
                logger.warning("run %s finished as %s with errors: %s", self.id, status, err)

    def fail(self, error: str | BaseException, *, timeout: float | None = None, timeout_s: float | None = None) -> None:
        """Finish the run as ``failed`` with ``error`` (an exception reads ``<Type>: <message>``)."""
        self.finish(status=RunStatus.FAILED, error=error, timeout=timeout, timeout_s=timeout_s)

    async def aflush(self, timeout_s: float | None = None) -> bool:
        """``flush`` without blocking the event loop; cancelling the await does not cancel the flush."""
        return await _in_thread(self.flush, timeout_s)

    async def afinish(self, summary: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """``finish`` without blocking the event loop; shielded: the records still land if cancelled."""
        await _in_thread(lambda: self.finish(summary, **kwargs))

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None or (issubclass(exc_type, SystemExit) and exc.code in (0, None)):
            self.finish()
            return
        if issubclass(exc_type, (KeyboardInterrupt, asyncio.CancelledError)):
            status, error = RunStatus.CANCELLED, "interrupted"
        else:
            status, error = RunStatus.FAILED, f"{exc_type.__name__}: {exc}"
        try:
            self.finish(status=status, error=error)
        except PrimeRunsError as err:
            # The block's own exception is the one to propagate.
            logger.warning("run %s finished as %s with upload errors: %s", self.id, status, err)

    # -- errors and accounting -------------------------------------------------

    def _note_error(self, error: SinkError) -> None:
        with self._state.lock:
            first = self._first_error is None
            if first:
                self._first_error = error
            self._errors.append(f"writing to the {error.sink} sink failed: {type(error).__name__}: {error}")
        if first and self._on_error == "warn":
            logger.warning("run %s: %s (further failures are counted in run.stats())", self.id, error)

    def _note_failure(self, what: str, error: BaseException) -> None:
        # A failure of the run's own requests (its status, its updates): recorded, never raised into training.
        self._errors.append(f"{what} failed: {type(error).__name__}: {error}")

    def _raise_first_error(self) -> None:
        if self._on_error == "raise" and self._first_error is not None:
            error, self._first_error = self._first_error, None
            raise error

    def stats(self) -> dict[str, Any]:
        """Queued, in flight, stored, dropped, failed by sink and reason, spooled, latency; ``metrics`` rows."""
        stats = self._worker.stats() if self._worker is not None else {}
        if self._metrics is not None:
            stats["metrics"] = self._metrics.stats()
        return stats

    @property
    def dropped_records(self) -> int:
        return self._worker.dropped_records if self._worker is not None else 0

    @property
    def failed_records(self) -> dict[str, int]:
        return self._worker.failed_records if self._worker is not None else {}

    def reset_after_fork(self) -> None:
        """What a forked child does (called for it after ``fork``): log its own records, never finish the run."""
        self._after_fork_in_child()

    def _after_fork_in_child(self) -> None:
        # The child logs its own records but never finishes the parent's run.
        self._state.after_fork_in_child()
        if self._updates is not None:
            self._updates.after_fork_in_child()
        self._finisher.after_fork_in_child()
        if self.mode == "online":
            os.environ.setdefault(ENV_RUN_ID, self.id)
            os.environ.setdefault(ENV_RUN_KIND, self.kind)


def _describe(error: str | BaseException | None) -> str | None:
    if error is None or isinstance(error, str):
        return error
    return f"{type(error).__name__}: {error}"


async def _in_thread(func: Any, *args: Any) -> Any:
    """Run ``func`` on a daemon thread; the await is shielded from cancellation."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(setter: Any, value: Any) -> None:
        if not future.done():
            setter(value)

    def deliver(setter: Any, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(settle, setter, value)
        except RuntimeError:  # the loop closed meanwhile; the work itself is done
            pass

    def work() -> None:
        try:
            result = func(*args)
        except BaseException as err:  # noqa: BLE001  (delivered to the awaiting task)
            deliver(future.set_exception, err)
        else:
            deliver(future.set_result, result)

    threading.Thread(target=work, name="prime-runs-await", daemon=True).start()
    return await asyncio.shield(future)
