"""Records and values as users produce them: nothing a user logs breaks the run, and every path agrees."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import zstandard
from _run_helpers import (  # noqa: F401  (isolated: an autouse fixture, used by its name)
    FLUSH_TIMEOUT_S,
    assert_buckets,
    get_run,
    isolated,
    online,
    stored_episodes,
)
from _run_helpers import episodes as run_episodes
from _wire import episode, trace

from prime_runs._records import lines as _encoding
from prime_runs._records.lines import RunStamp
from prime_traces import TracesClient
from prime_traces._lines.encoder import encode_record
from prime_traces.encoding import MAX_LINE_BYTES


class _Raises:
    """A record whose ``to_record()`` raises a ``BaseException`` that is not an ``Exception``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def to_record(self) -> dict[str, Any]:
        raise self.error


@pytest.mark.parametrize("error", [asyncio.CancelledError(), SystemExit(3), GeneratorExit()], ids=repr)
def test_a_base_exception_from_to_record_fails_that_record_alone(service, error):
    run = online(service, console="off")
    run.log_episodes([episode("before", [trace("before-t")]), _Raises(error), episode("beside", [trace("beside-t")])])
    run.log_episodes([episode("after", [trace("after-t")])])
    started = time.monotonic()
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert time.monotonic() - started < 5  # the worker lived: no timeout burnt
    assert stored_episodes(service) == {"before": 1, "beside": 1, "after": 1}
    counts = run.stats()["sinks"]["traces"]
    assert counts["stored"] == 3 and counts["failed"] == {"invalid_record": 1}
    assert f"to_record() raised {type(error).__name__}" in counts["failure_details"]["invalid_record"]


def test_no_value_in_config_or_summary_stops_the_status_from_being_recorded(service):
    run = online(service, console="off", config={"lr": np.float32(0.25), 7: "seven"})
    run.update_config({"layers": {1: np.int64(3)}, "tags": {"a"}})
    run.update_summary({3: 1.0, "np": np.float64(0.5)})
    run.log({3: 1.0, "x": np.float32(0.25)}, step=0)
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    remote = get_run(service, run.id)
    assert remote["status"] == "completed"
    assert remote["config"]["lr"] == 0.25 and remote["config"]["7"] == "seven"
    assert remote["config"]["layers"] == {"1": 3} and remote["config"]["tags"] == "{'a'}"
    assert remote["summary"]["3"] == 1.0 and remote["summary"]["np"] == 0.5 and remote["summary"]["x"] == 0.25


def test_traces_given_as_a_tuple_are_stamped_with_the_run():
    stamp = RunStamp("run-9", "train")
    stamped = stamp.apply({"id": "e", "traces": (trace("t1"), trace("t2"))}, "episode")
    assert [t["run"]["id"] for t in stamped["traces"]] == ["run-9", "run-9"]
    assert stamped["run"] == {"id": "run-9", "type": "train"}


def test_a_tuple_of_traces_arrives_with_the_run(service):
    run = online(service, console="off")
    run.log_episodes([{**episode("tup", []), "traces": (trace("tup-t1"), trace("tup-t2"))}])
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    with TracesClient("test-key", service.url) as client:
        assert sorted(t.trace_id for t in client.iter(run_id=run.id)) == ["tup-t1", "tup-t2"]


class _Both:
    """An object offering both forms: every path must use the same one (its own bytes)."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document

    def to_json(self) -> bytes:
        return orjson.dumps(self.document)

    def to_record(self) -> dict[str, Any]:
        return {**self.document, "traces": [{**t, "from": "to_record"} for t in self.document["traces"]]}


def test_one_record_rule_for_the_client_and_the_run(service):
    document = episode("both", [trace("both-t")])
    assert orjson.loads(encode_record(_Both(document), 0)) == document  # the client: its bytes
    run = online(service, console="off")
    run.log_episodes([_Both(document)])
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    with TracesClient("test-key", service.url) as client:
        [summary] = list(client.iter(run_id=run.id))
        stored = orjson.loads(client.get_raw(summary.trace_id))
    assert "from" not in stored  # the run used the same bytes (parsed to stamp them), never to_record()


class _Serialised:
    """A producer's own serialiser, with the run already in the bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def to_json(self) -> bytes:
        return self.data


def _lag_during(work: Any) -> float:
    """The longest gap a 1 ms ticker on another thread saw while ``work`` ran (GIL holds show up here)."""
    stop = threading.Event()
    gaps: list[float] = []

    def tick() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        work()
    finally:
        stop.set()
        ticker.join()
    return max(gaps)


def test_to_json_records_that_carry_the_run_are_never_parsed(service, monkeypatch):
    run = online(service, console="off")
    members = [trace(f"big-t{i}", info={"text": "word " * 300_000}) for i in range(8)]  # ~12 MB
    document = {**episode("big", members), "run": {"id": run.id, "type": "train"}}
    for member in document["traces"]:
        member["run"] = {"id": run.id, "type": "train"}
    data = orjson.dumps(document)
    parsed: list[int] = []
    real_parsed = _encoding._parsed
    monkeypatch.setattr(_encoding, "_parsed", lambda line, index: parsed.append(len(line)) or real_parsed(line, index))
    run.log_episodes([_Serialised(data)])
    assert run.flush(timeout_s=FLUSH_TIMEOUT_S)
    assert parsed == []  # used as it is
    run.log_episodes([_Serialised(orjson.dumps(episode("unstamped", [trace("unstamped-t")])))])
    assert run.flush(timeout_s=FLUSH_TIMEOUT_S)
    assert len(parsed) == 1  # without the run: parsed, and stamped
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert stored_episodes(service) == {"big": 1, "unstamped": 1}
    # What the parse it no longer does would cost the caller's threads (order of magnitude).
    assert _lag_during(lambda: orjson.loads(data)) > 5 * _lag_during(lambda: data.find(run.id.encode()))


class _OwnJson:
    """A record that serialises itself, as a producer with its own encoder does."""

    def __init__(self, data: bytes | str | Exception) -> None:
        self.data = data

    def to_json(self) -> bytes | str:
        if isinstance(self.data, Exception):
            raise self.data
        return self.data


def test_to_json_records_are_stamped_with_the_run_and_stored_as_their_bytes_say(service):
    docs = [episode(f"j{i}", [trace(f"j{i}-t{k}", info={"k": k}) for k in range(2)]) for i in range(2)]
    records = [
        _OwnJson(orjson.dumps(docs[0])),
        _OwnJson(b'{"id": "torn", "traces": ['),
        _OwnJson(orjson.dumps(docs[1]).decode()),
        _OwnJson(ValueError("serialiser broke")),
    ]
    run = online(service, console="off")
    assert run.log_episodes(records)
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    stamp = {"id": run.id, "type": "eval"}
    with service.state.store.reader() as conn:
        members = {d["id"]: d for d in (orjson.loads(r) for (r,) in conn.execute("SELECT raw FROM trace_docs"))}
        envelopes = {d["id"]: d for d in (orjson.loads(r) for (r,) in conn.execute("SELECT raw FROM episode_docs"))}
    # Bytes and str alike: parsed, stamped on the envelope and every member, the rest as the producer wrote it.
    assert sorted(envelopes) == ["j0", "j1"] and sorted(members) == ["j0-t0", "j0-t1", "j1-t0", "j1-t1"]
    for doc in docs:
        assert envelopes[doc["id"]]["run"] == stamp
        assert {k: v for k, v in envelopes[doc["id"]].items() if k not in ("run", "traces")} == {
            k: v for k, v in doc.items() if k not in ("run", "traces")
        }
        for member in doc["traces"]:
            assert members[member["id"]] == {**member, "run": {**member["run"], **stamp}}
    counts = run.stats()["sinks"]["traces"]
    assert "to_json()" in counts["failure_details"]["invalid_record"]  # the first of the two, named
    assert_buckets(run, submitted=4, stored=2, failed={"invalid_record": 2})


def test_a_record_over_64_mib_is_refused_alone_and_kept_aside_and_the_others_are_stored(service):
    run = online(service, console="off")
    huge = episode("huge", [trace("huge-t", info={"text": "x" * MAX_LINE_BYTES})])  # one string: 64 MiB
    assert run.log_episodes([*run_episodes("before", 2), huge, *run_episodes("after", 2)])
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert stored_episodes(service) == {"before0": 1, "before1": 1, "after0": 1, "after1": 1}
    detail = run.stats()["sinks"]["traces"]["failure_details"]["record_too_large"]
    assert detail.startswith("record 'huge' (log_episodes call 1, item 2): ") and f"limit of {MAX_LINE_BYTES}" in detail
    assert_buckets(run, submitted=5, stored=4, failed={"record_too_large": 1})
    # Kept aside with its reason; only the head of the entry is read back, not the 64 MiB.
    [path] = Path(run.dir).glob("rejected-*.jsonl.zst")
    with path.open("rb") as handle:
        head = zstandard.ZstdDecompressor().stream_reader(handle).read(200)
    assert head.startswith(b'{"id":"huge","line_format":"episode","code":"record_too_large"'), head
