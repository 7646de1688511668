"""Where every record went: the counters' identity holds whatever order the workers report in."""

from __future__ import annotations

from prime_runs._records.accounting import Accounting


def counts(accounting: Accounting) -> dict[str, int]:
    sink = accounting.snapshot()["sinks"]["traces"]
    return {k: sink[k] for k in ("stored", "spooled", "resynced")}


def test_records_uploaded_from_disk_before_their_spill_is_counted_are_stored_once_it_is():
    # The run's drain reads each entry of a spool file as soon as it is durable; the worker counts the
    # write spooled once all of it is. Uploaded first, they must still end up stored, not left "spooled".
    accounting = Accounting(["traces"])
    accounting.count_submit(10, 0.0)
    accounting.count_spooled("traces", 4, "backlog")
    accounting.count_resynced("traces", 7)  # 4 counted spooled, 3 whose spill is not counted yet
    assert counts(accounting) == {"stored": 4, "spooled": 0, "resynced": 4}
    accounting.count_spooled("traces", 6, "backlog")  # the rest of the write: 3 of them already uploaded
    assert counts(accounting) == {"stored": 7, "spooled": 3, "resynced": 7}
    assert accounting.unaccounted("traces") == 0
    accounting.count_resynced("traces", 3)
    assert counts(accounting) == {"stored": 10, "spooled": 0, "resynced": 10}
    assert accounting.unaccounted("traces") == 0


def test_the_usual_order_moves_each_record_once():
    accounting = Accounting(["traces"])
    accounting.count_submit(5, 0.0)
    accounting.count_spooled("traces", 5, "outage")
    accounting.count_resynced("traces", 2)
    accounting.count_resynced("traces", 3)
    assert counts(accounting) == {"stored": 5, "spooled": 0, "resynced": 5}
    assert accounting.snapshot()["sinks"]["traces"]["spooled_reasons"] == {"outage": 5}
