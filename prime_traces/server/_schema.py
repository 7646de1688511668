"""The local service's database schema, and bringing an older database up to it.

:func:`apply_schema` runs on every start: each table and index is created
when missing, and each column added after a table first shipped (``ADDED_COLUMNS``)
is added to a database made before it, so a database written by an earlier
version opens unchanged and keeps everything it holds.

What the tables hold:

- ``uploads``, ``traces``/``trace_docs``, ``episodes``/``episode_docs``: the
  committed uploads, their summary columns, and the documents in tables of
  their own so that list queries never page through multi-megabyte blobs.
- ``runs``: a run's lifecycle (contract §9 and §10); ``platform`` is what the
  platform's run routes were told about it (a JSON object, null for a run
  created through ``POST /runs``).
- ``run_metrics``: a run's metrics history, one row per stepped ``(run_id,
  step)`` (the unique index; SQLite's NULLs are distinct, so unstepped rows
  may repeat), its metrics a JSON object in text.
- ``environments``: the local stand-in for the platform's environments hub,
  one row per ``(owner, name, team_id)`` (``''`` where there is none).
- ``eval_samples``: an evaluation's legacy sample rows, one per ``(run_id,
  sample_id)`` when the row has a sample id.
- ``train_sample_files``/``train_sample_data``: a training run's legacy sample
  files (Parquet), presigned, uploaded and confirmed; only a SHA-256 of the
  upload URL's token is kept, never the token.

Times are epoch seconds (REAL).
"""

from __future__ import annotations

import logging
import sqlite3

logger = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS uploads (
    upload_id      TEXT PRIMARY KEY,
    line_format    TEXT NOT NULL,
    receipt        TEXT NOT NULL,
    producer       TEXT NOT NULL,
    context        TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    line_count     INTEGER NOT NULL,
    size_bytes     INTEGER NOT NULL,
    ingested_at    REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS traces (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    trace_id       TEXT NOT NULL,
    upload_id      TEXT NOT NULL,
    episode_id     TEXT,
    episode_seq    INTEGER,
    created_at     REAL NOT NULL,
    ingested_at    REAL NOT NULL,
    run_id         TEXT,
    run_type       TEXT,
    run_step       INTEGER,
    environment_id TEXT,
    model_provider TEXT,
    model_id       TEXT,
    task_id        TEXT,
    agent_name     TEXT,
    reward         REAL,
    outcome        TEXT,
    has_error      INTEGER NOT NULL,
    is_truncated   INTEGER NOT NULL,
    duration_ms    INTEGER NOT NULL,
    total_tokens   INTEGER NOT NULL,
    size_bytes     INTEGER NOT NULL,
    context        TEXT NOT NULL,
    producer       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS traces_created ON traces (created_at DESC, seq DESC);
CREATE INDEX IF NOT EXISTS traces_trace_id ON traces (trace_id);
CREATE INDEX IF NOT EXISTS traces_run ON traces (run_id, created_at DESC);
CREATE INDEX IF NOT EXISTS traces_episode ON traces (episode_seq);
CREATE INDEX IF NOT EXISTS traces_upload ON traces (upload_id);
CREATE TABLE IF NOT EXISTS trace_docs (
    seq INTEGER PRIMARY KEY,
    raw BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS episodes (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    episode_id     TEXT NOT NULL,
    upload_id      TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    created_at     REAL NOT NULL,
    ingested_at    REAL NOT NULL,
    run_id         TEXT,
    environment_id TEXT,
    outcome        TEXT,
    has_error      INTEGER NOT NULL,
    error_type     TEXT,
    error_message  TEXT,
    context        TEXT NOT NULL,
    producer       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS episodes_created ON episodes (created_at DESC, seq DESC);
CREATE INDEX IF NOT EXISTS episodes_episode_id ON episodes (episode_id);
CREATE INDEX IF NOT EXISTS episodes_run ON episodes (run_id);
CREATE TABLE IF NOT EXISTS episode_docs (
    seq INTEGER PRIMARY KEY,
    raw BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    run_id      TEXT PRIMARY KEY,
    name        TEXT,
    kind        TEXT,
    config      TEXT NOT NULL,
    summary     TEXT NOT NULL,
    tags        TEXT NOT NULL,
    status      TEXT NOT NULL,
    error       TEXT,
    created_at  REAL NOT NULL,
    finished_at REAL,
    created_by  TEXT,
    platform    TEXT
);
CREATE TABLE IF NOT EXISTS run_metrics (
    seq     INTEGER PRIMARY KEY,
    run_id  TEXT NOT NULL,
    step    INTEGER,
    time    REAL NOT NULL,
    metrics TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS run_metrics_step ON run_metrics (run_id, step);
CREATE INDEX IF NOT EXISTS run_metrics_unstepped ON run_metrics (run_id, time) WHERE step IS NULL;
CREATE TABLE IF NOT EXISTS environments (
    env_id     TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    name       TEXT NOT NULL,
    team_id    TEXT NOT NULL,
    created_at REAL NOT NULL,
    created_by TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS environments_name ON environments (owner, name, team_id);
CREATE TABLE IF NOT EXISTS eval_samples (
    seq       INTEGER PRIMARY KEY,
    run_id    TEXT NOT NULL,
    sample_id TEXT,
    sample    TEXT NOT NULL,
    pushed_at REAL NOT NULL,
    producer  TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS eval_samples_id ON eval_samples (run_id, sample_id);
CREATE INDEX IF NOT EXISTS eval_samples_run ON eval_samples (run_id, seq);
CREATE TABLE IF NOT EXISTS train_sample_files (
    s3_key       TEXT PRIMARY KEY,
    run_id       TEXT NOT NULL,
    step         INTEGER NOT NULL,
    token_sha256 TEXT NOT NULL UNIQUE,
    expires_at   REAL NOT NULL,
    created_at   REAL NOT NULL,
    created_by   TEXT NOT NULL,
    size_bytes   INTEGER,
    sha256       TEXT,
    uploaded_at  REAL,
    confirmed_at REAL
);
CREATE INDEX IF NOT EXISTS train_sample_files_run ON train_sample_files (run_id, step);
CREATE TABLE IF NOT EXISTS train_sample_data (
    s3_key TEXT PRIMARY KEY,
    data   BLOB NOT NULL
);
"""

#: ``(table, column, declaration)`` of every column added to a table after it first shipped.
ADDED_COLUMNS = (("runs", "platform", "TEXT"),)


def apply_schema(conn: sqlite3.Connection) -> None:
    """Create what is missing, then add the columns an older database lacks (one transaction)."""
    conn.executescript(SCHEMA)
    # Under the write lock of the database, so that two services opening the
    # same older file do not both add a column.
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table, column, declaration in ADDED_COLUMNS:
            present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            if column not in present:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
                logger.info("added column %s.%s to a database made before it", table, column)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
