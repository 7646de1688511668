"""SQLite storage of the local Traces service: connections, transactions, upload commits.

One writer connection, serialised by a lock (SQLite admits one writer at a
time anyway); reads open their own short-lived connection so a long raw
stream never holds up ingest. WAL mode lets both proceed at once. The
tables are described, created and upgraded in ``_schema``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from prime_traces.server._schema import apply_schema

logger = logging.getLogger(__name__)

TRACE_COLUMNS = (
    "trace_id",
    "upload_id",
    "episode_id",
    "created_at",
    "ingested_at",
    "run_id",
    "run_type",
    "run_step",
    "environment_id",
    "model_provider",
    "model_id",
    "task_id",
    "agent_name",
    "reward",
    "outcome",
    "has_error",
    "is_truncated",
    "duration_ms",
    "total_tokens",
    "size_bytes",
    "context",
    "producer",
)
EPISODE_COLUMNS = (
    "episode_id",
    "upload_id",
    "schema_version",
    "created_at",
    "ingested_at",
    "run_id",
    "environment_id",
    "outcome",
    "has_error",
    "error_type",
    "error_message",
    "context",
    "producer",
)


# Rows are inserted in chunks of at most this many rows or document bytes,
# so an upload's rows never all exist at once.
INSERT_CHUNK_ROWS = 2000
INSERT_CHUNK_BYTES = 8 << 20
_TRACE_INSERT = (
    f"INSERT INTO traces (seq, {', '.join(TRACE_COLUMNS)}, episode_seq) "
    f"VALUES ({', '.join('?' * (len(TRACE_COLUMNS) + 2))})"
)
_EPISODE_INSERT = (
    f"INSERT INTO episodes ({', '.join(EPISODE_COLUMNS)}) VALUES ({', '.join('?' * len(EPISODE_COLUMNS))})"
)


@dataclass
class TraceRow:
    """One trace to store: its summary columns and its document bytes."""

    columns: dict[str, Any]
    raw: bytes


@dataclass
class EpisodeRow:
    """One episode envelope to store, with its member traces."""

    columns: dict[str, Any]
    raw: bytes
    members: list[TraceRow] = field(default_factory=list)


@dataclass
class UploadRecord:
    """The receipt and bookkeeping of one committed upload."""

    upload_id: str
    line_format: str
    receipt: dict[str, Any]
    producer: str
    context: dict[str, str]
    schema_version: int
    line_count: int
    size_bytes: int
    ingested_at: float


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=60.0, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=OFF")
    conn.row_factory = sqlite3.Row
    return conn


class Store:
    """The service's database. Thread-safe: writes serialise on one lock."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        parent = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(parent, exist_ok=True)
        self._write_lock = threading.Lock()
        self._writer = _connect(self.path)
        apply_schema(self._writer)

    def close(self) -> None:
        with self._write_lock:
            self._writer.close()

    @contextlib.contextmanager
    def reader(self) -> Iterator[sqlite3.Connection]:
        """A connection for reads only, closed on exit."""
        conn = _connect(self.path)
        try:
            yield conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def writer(self) -> Iterator[sqlite3.Connection]:
        """The writer connection inside one transaction, under the write lock."""
        with self._write_lock:
            self._writer.execute("BEGIN IMMEDIATE")
            try:
                yield self._writer
            except BaseException:
                self._writer.execute("ROLLBACK")
                raise
            self._writer.execute("COMMIT")

    # -- uploads -----------------------------------------------------------

    def find_upload(self, upload_id: str) -> UploadRecord | None:
        # A reader, not the writer: a replay is not held up by an upload being
        # stored, and commit_upload checks again under the write lock.
        with self.reader() as conn:
            row = conn.execute("SELECT * FROM uploads WHERE upload_id = ?", (upload_id,)).fetchone()
        return _upload_from_row(row) if row is not None else None

    def commit_upload(
        self,
        upload: UploadRecord,
        rows: Iterable[TraceRow | EpisodeRow],
        *,
        keep_documents: bool = True,
    ) -> tuple[UploadRecord, bool]:
        """Store an upload all or nothing, taking ``rows`` a chunk at a time.

        Returns ``(record, created)``. When the digest was committed meanwhile
        by a concurrent request, nothing is stored (``rows`` is not iterated)
        and the existing record is returned with ``created=False`` (the caller
        answers it as a replay or a conflict). Whatever ``rows`` raises rolls
        the whole upload back.
        """
        with self.writer() as conn:
            row = conn.execute("SELECT * FROM uploads WHERE upload_id = ?", (upload.upload_id,)).fetchone()
            if row is not None:
                return _upload_from_row(row), False
            conn.execute(
                "INSERT INTO uploads VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    upload.upload_id,
                    upload.line_format,
                    orjson.dumps(upload.receipt).decode(),
                    upload.producer,
                    orjson.dumps(upload.context).decode(),
                    upload.schema_version,
                    upload.line_count,
                    upload.size_bytes,
                    upload.ingested_at,
                ),
            )
            if keep_documents:
                for chunk in _chunks(rows):
                    _insert_traces(conn, [r for r in chunk if isinstance(r, TraceRow)], None)
                    for episode in chunk:
                        if isinstance(episode, EpisodeRow):
                            _insert_episode(conn, episode)
        return upload, True


def _chunks(rows: Iterable[TraceRow | EpisodeRow]) -> Iterator[list[TraceRow | EpisodeRow]]:
    chunk: list[TraceRow | EpisodeRow] = []
    count = size = 0
    for row in rows:
        chunk.append(row)
        members = row.members if isinstance(row, EpisodeRow) else ()
        count += 1 + len(members)
        size += len(row.raw) + sum(len(m.raw) for m in members)
        if count >= INSERT_CHUNK_ROWS or size >= INSERT_CHUNK_BYTES:
            yield chunk
            chunk, count, size = [], 0, 0
    if chunk:
        yield chunk


def _next_seq(conn: sqlite3.Connection, table: str) -> int:
    """The seq SQLite's AUTOINCREMENT would give the next row: never one used before."""
    used = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,)).fetchone()
    top = conn.execute(f"SELECT MAX(seq) FROM {table}").fetchone()[0]
    return max(used[0] if used else 0, top or 0) + 1


def _insert_traces(conn: sqlite3.Connection, traces: list[TraceRow], episode_seq: int | None) -> None:
    if not traces:
        return
    # Seqs given explicitly (under the write lock) so that both tables take one
    # executemany each; SQLite's AUTOINCREMENT counter follows them.
    first = _next_seq(conn, "traces")
    conn.executemany(
        _TRACE_INSERT,
        ((first + i, *(t.columns[name] for name in TRACE_COLUMNS), episode_seq) for i, t in enumerate(traces)),
    )
    conn.executemany("INSERT INTO trace_docs VALUES (?, ?)", ((first + i, t.raw) for i, t in enumerate(traces)))


def _insert_episode(conn: sqlite3.Connection, episode: EpisodeRow) -> None:
    cur = conn.execute(_EPISODE_INSERT, [episode.columns[name] for name in EPISODE_COLUMNS])
    seq = cur.lastrowid
    conn.execute("INSERT INTO episode_docs VALUES (?, ?)", (seq, episode.raw))
    _insert_traces(conn, episode.members, seq)


def _upload_from_row(row: sqlite3.Row) -> UploadRecord:
    return UploadRecord(
        upload_id=row["upload_id"],
        line_format=row["line_format"],
        receipt=orjson.loads(row["receipt"]),
        producer=row["producer"],
        context=orjson.loads(row["context"]),
        schema_version=row["schema_version"],
        line_count=row["line_count"],
        size_bytes=row["size_bytes"],
        ingested_at=row["ingested_at"],
    )
