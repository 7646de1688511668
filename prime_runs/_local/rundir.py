"""The run directory: what a run keeps on local disk, and how it is written safely.

One directory per run, ``<dir>/<run-id>/`` (``init(dir=...)``, else
``PRIME_RUNS_DIR``, else ``./prime-runs``)::

    run.json                                 identity, config, summary, status, counters (the owner's)
    episode-<host>-<pid>-000001.jsonl.zst    records to upload, per line format and writing process
    trace-<host>-<pid>-000001.jsonl.zst
    rejected-<host>-<pid>-000001.jsonl.zst   records refused, with why; kept, never retried
    sync.json                                what ``prime-runs sync`` has uploaded
    local/                                   ``save_local=True``: a copy of every record logged

``run.json`` and ``sync.json`` are replaced atomically (a temporary file in
the same directory, fsynced, ``os.replace``, the directory fsynced) under one
lock for every writer in the process, so a crash leaves the old file or the
new one, never a mix. The owner of a run holds a lock on ``.owner.lock`` for
as long as it lives, which tells a later reader whether a run that says
``running`` still is.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from typing import Any

import orjson

from prime_runs._local.damage import Damage, check_sealed, sealed_sizes, set_torn_tail_aside
from prime_runs._local.segment_reader import Scan, scan
from prime_runs._local.segments import (
    DATA_KINDS,
    METRICS,
    REJECTED,
    fsync_directory,
    segment_files,
)
from prime_runs.errors import PrimeRunsError
from prime_traces.threads import call_in_forked_child

try:
    import fcntl
except ImportError:  # Windows: liveness cannot be told; runs that say "running" are taken at their word
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

ENV_DIR = "PRIME_RUNS_DIR"
DEFAULT_DIR = "prime-runs"
MAX_RUN_ID_CHARS = 128
RUN_FILE = "run.json"
SYNC_FILE = "sync.json"
LOCAL_DIR = "local"
FORMAT_VERSION = 1
_OWNER_LOCK = ".owner.lock"
_SYNC_LOCK = ".sync.lock"
_TMP_SUFFIX = ".tmp"
_LOCK_POLL_S = 0.05  # how often a sync waiting for another one's lock tries again


def check_run_id(run_id: str, source: str) -> str:
    """``run_id`` if it can name a directory inside the runs directory; else a clear error."""
    why = None
    if not isinstance(run_id, str) or not run_id:
        why = "is empty"
    elif len(run_id) > MAX_RUN_ID_CHARS:
        why = f"is {len(run_id)} characters long, over {MAX_RUN_ID_CHARS}"
    elif run_id in (".", ".."):
        why = "names a directory itself"
    elif "/" in run_id or "\\" in run_id:
        why = "contains a path separator"
    elif any(ord(c) < 0x20 or ord(c) == 0x7F for c in run_id):
        why = "contains a control character"
    if why is not None:
        raise PrimeRunsError(
            f"run id {run_id!r} (from {source}) {why}; a run id names a directory, so use up to "
            f"{MAX_RUN_ID_CHARS} letters, digits, '-', '_' or '.'"
        )
    return run_id


def runs_root(directory: str | os.PathLike[str] | None = None) -> str:
    """The directory that holds run directories: the argument, ``PRIME_RUNS_DIR``, or ``./prime-runs``."""
    if directory is not None:
        return os.fspath(directory)
    return os.environ.get(ENV_DIR) or DEFAULT_DIR


class _Locks:
    """The one lock of every atomic writer in this process (fresh in a forked child)."""

    def __init__(self) -> None:
        self.reset()
        call_in_forked_child(self.reset)

    def reset(self) -> None:
        self.write = threading.Lock()


_locks = _Locks()


def write_json_atomic(path: str, document: Any) -> None:
    """Replace ``path`` with ``document`` as JSON: the old file or the new one survives a crash, never a mix."""
    data = (
        orjson.dumps(
            document, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY, default=str
        )
        + b"\n"
    )
    directory = os.path.dirname(path) or "."
    with _locks.write:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=_TMP_SUFFIX, dir=directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                if hasattr(os, "fchmod"):
                    os.fchmod(handle.fileno(), 0o644)  # mkstemp's 0600 would hide the run from its team
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        fsync_directory(directory)


def read_json(path: str) -> dict[str, Any] | None:
    """The JSON object in ``path``; ``None`` when it is missing. Raises ``PrimeRunsError`` when unreadable."""
    try:
        with open(path, "rb") as handle:
            document = orjson.loads(handle.read())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError) as err:
        raise PrimeRunsError(f"cannot read {path}: {err}") from err
    if not isinstance(document, dict):
        raise PrimeRunsError(f"{path} does not hold a JSON object")
    return document


class RunDirectory:
    """One run's directory: its files, their atomic updates, the owner's lock and torn-tail repair.

    Nothing is created until :meth:`create` (or a segment's first write).
    Usage::

        rundir = RunDirectory(os.path.join(runs_root(), run_id))
        rundir.create()
        rundir.write_run({"id": run_id, "status": "running"})
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._owner_fd: int | None = None
        self._sync_fd: int | None = None
        call_in_forked_child(self._after_fork_in_child)

    def __repr__(self) -> str:
        return f"RunDirectory({self.path!r})"

    @property
    def run_id(self) -> str:
        return os.path.basename(os.path.normpath(self.path))

    @property
    def local_path(self) -> str:
        return os.path.join(self.path, LOCAL_DIR)

    def exists(self) -> bool:
        return os.path.isdir(self.path)

    def create(self) -> None:
        os.makedirs(self.path, exist_ok=True)

    # -- run.json and sync.json --------------------------------------------------

    def read_run(self) -> dict[str, Any] | None:
        return read_json(os.path.join(self.path, RUN_FILE))

    def write_run(self, document: dict[str, Any]) -> None:
        self.create()
        write_json_atomic(os.path.join(self.path, RUN_FILE), {"format": FORMAT_VERSION, **document})

    def read_sync(self) -> dict[str, Any]:
        return read_json(os.path.join(self.path, SYNC_FILE)) or {}

    def write_sync(self, document: dict[str, Any]) -> None:
        write_json_atomic(os.path.join(self.path, SYNC_FILE), {"format": FORMAT_VERSION, **document})

    # -- locks -------------------------------------------------------------------

    def hold_owner_lock(self) -> None:
        """Hold ``.owner.lock`` for this process's lifetime: the run is live while it is held."""
        if fcntl is None or self._owner_fd is not None:
            return
        self.create()
        self._owner_fd = self._lock_file(
            _OWNER_LOCK,
            f"run directory {self.path} belongs to a run that is still running in another process; "
            "pass another id, or attach without owning the run (set RANK to a non-zero rank)",
        )

    def release_owner_lock(self) -> None:
        fd, self._owner_fd = self._owner_fd, None
        if fd is not None:
            os.close(fd)

    def owner_alive(self) -> bool:
        """Whether a process holds the owner's lock (unknowable without ``fcntl``: then True)."""
        if fcntl is None:
            return True
        if self._owner_fd is not None:
            return True
        try:
            fd = os.open(os.path.join(self.path, _OWNER_LOCK), os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def lock_for_sync(self, *, wait_s: float = 0.0) -> None:
        """Take the lock that lets one ``sync`` at a time upload this run (until :meth:`unlock_sync`).

        Another sync holding it is waited for up to ``wait_s`` (a run's own
        drain ending after ``finish()`` lets go within a second or two).
        """
        if fcntl is None or self._sync_fd is not None:
            return
        held = f"another prime-runs sync is uploading {self.path}; wait for it to finish"
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self._sync_fd = self._lock_file(_SYNC_LOCK, held)
                return
            except PrimeRunsError:
                if time.monotonic() >= deadline:
                    raise
            threading.Event().wait(_LOCK_POLL_S)  # flock has no timed wait

    def _lock_file(self, name: str, held_elsewhere: str) -> int:
        """An exclusive lock on ``name`` in the directory, held until its descriptor closes."""
        assert fcntl is not None
        fd = os.open(os.path.join(self.path, name), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PrimeRunsError(held_elsewhere) from None
        return fd

    def unlock_sync(self) -> None:
        fd, self._sync_fd = self._sync_fd, None
        if fd is not None:
            os.close(fd)

    def _after_fork_in_child(self) -> None:
        # The locks are the parent's: the child closes its copies, never unlocks them.
        for fd in (self._owner_fd, self._sync_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._owner_fd = self._sync_fd = None

    # -- segments ----------------------------------------------------------------

    def data_segments(self) -> list[str]:
        return segment_files(self.path, DATA_KINDS)

    def rejected_segments(self) -> list[str]:
        return segment_files(self.path, (REJECTED,))

    def metrics_segments(self) -> list[str]:
        return segment_files(self.path, (METRICS,))

    def recover(self, damaged: list[Damage] | None = None) -> list[Scan]:
        """Cut torn tails off every segment no live process holds; the scans of those that had one.

        A record file ``run.json`` says was closed whole and that now reads
        fewer lines is damage, not a tear: its unreadable bytes are set aside
        (``damage.py``) and it is added to ``damaged``.
        """
        torn = []
        try:
            sealed = sealed_sizes(self.read_run())
        except (PrimeRunsError, OSError):
            sealed = {}
        for directory in (self.path, self.local_path):
            for path in segment_files(directory, (*DATA_KINDS, REJECTED, METRICS)):
                try:
                    written = sealed.get(os.path.basename(path)) if directory == self.path else None
                    damage = check_sealed(path, *written) if written is not None else None
                    if damage is not None:
                        logger.warning("%s", damage.describe())
                        if damaged is not None:
                            damaged.append(damage)
                        continue
                    aside = set_torn_tail_aside(path)
                    result = scan(path, repair=True)
                except OSError as err:
                    logger.warning("cannot check %s for a torn tail: %s", path, err)
                    continue
                if result.torn_bytes:
                    logger.warning(
                        "%s: %s; cut %d bytes off after the last whole entry (%d lines kept; the bytes are kept in %s)",
                        path,
                        result.problem,
                        result.torn_bytes,
                        result.lines,
                        aside,
                    )
                    torn.append(result)
        self._remove_stale_temporaries()
        return torn

    def _remove_stale_temporaries(self) -> None:
        # Left by a writer that died between creating its temporary file and
        # renaming it; a live writer's (the owner's, a sync's) is left alone.
        prefixes = []
        if not self.owner_alive():
            prefixes.append(f".{RUN_FILE}.")
        if self._sync_fd is not None:
            prefixes.append(f".{SYNC_FILE}.")
        try:
            names = os.listdir(self.path) if prefixes else []
        except FileNotFoundError:
            return
        for name in names:
            if name.endswith(_TMP_SUFFIX) and name.startswith(tuple(prefixes)):
                try:
                    os.unlink(os.path.join(self.path, name))
                except OSError:
                    pass
