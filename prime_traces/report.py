"""What happened to every line of an upload: the report inside ``UploadError``.

A batch is the unit the service commits or refuses, so outcomes are kept per
batch, and each line's status follows from its batch's. The invariants:
nothing the service stored is reported lost, and nothing lost is reported
stored. A batch whose answer never came (abandoned at cancellation) is
neither: it is ``ABANDONED``, and re-sending it is safe because the service
replays a committed digest.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

__all__ = [
    "BatchOutcome",
    "BatchStatus",
    "LineStatus",
    "UploadReport",
]

if TYPE_CHECKING:
    from prime_traces._api.models import UploadReceipt
    from prime_traces.errors import LineRejection, PrimeTracesError


class LineStatus(str, enum.Enum):
    """The fate of one input line."""

    COMMITTED = "committed"  # stored; its batch's receipt says so
    REJECTED = "rejected"  # the line the service (or the client) refused
    NOT_STORED = "not_stored"  # refused along with its batch because of another line
    FAILED = "failed"  # its batch failed transiently (retries exhausted); safe to resend
    ABANDONED = "abandoned"  # its batch was in flight at cancellation; outcome unknown, safe to resend
    UNSENT = "unsent"  # never sent
    SKIPPED = "skipped"  # blank input line, nothing to send

    def __str__(self) -> str:
        return self.value


class BatchStatus(str, enum.Enum):
    """The fate of one batch."""

    COMMITTED = "committed"
    REJECTED = "rejected"
    FAILED = "failed"
    ABANDONED = "abandoned"
    UNSENT = "unsent"

    def __str__(self) -> str:
        return self.value


@dataclass
class BatchOutcome:
    """One batch: its lines (input indexes), key, status, receipt or error.

    For a rejection the service located, ``rejected_line`` is the input index
    of the refused line and ``record_id`` its id.
    """

    index: int
    line_indexes: list[int]
    key: str | None
    status: BatchStatus
    receipt: UploadReceipt | None = None
    error: PrimeTracesError | BaseException | None = None
    rejected_line: int | None = None
    record_id: str | None = None
    code: str | None = None
    #: Every rejected line the service listed (contract §9): input index -> its rejection.
    rejected_lines: dict[int, LineRejection] = field(default_factory=dict)

    def status_of(self, line_index: int) -> LineStatus:
        if self.status is BatchStatus.REJECTED:
            if self.rejected_lines:
                return LineStatus.REJECTED if line_index in self.rejected_lines else LineStatus.NOT_STORED
            # Without a located line the whole batch stands refused.
            if self.rejected_line is None or self.rejected_line == line_index:
                return LineStatus.REJECTED
            return LineStatus.NOT_STORED
        return LineStatus(self.status.value)


@dataclass
class UploadReport:
    """Every batch of one upload, in order, and where sending stopped.

    ``unsent_from_line`` is the input index from which no line was batched
    (``None`` when the input was consumed to its end); lines from there on
    are ``UNSENT``. ``stopped``: the caller asked the upload to stop sending
    (see ``TracesClient.upload_lines``), and every batch sent before finished.
    """

    batches: list[BatchOutcome] = field(default_factory=list)
    unsent_from_line: int | None = None
    #: The upload stopped sending because its caller asked (``stop``), not because anything failed.
    stopped: bool = False

    def status_of(self, line_index: int) -> LineStatus:
        """The status of the input line at ``line_index`` (0-based)."""
        for batch in self.batches:
            if line_index in batch.line_indexes:
                return batch.status_of(line_index)
        if self.unsent_from_line is not None and line_index >= self.unsent_from_line:
            return LineStatus.UNSENT
        return LineStatus.SKIPPED

    def lines_with(self, status: LineStatus) -> list[int]:
        """Input indexes of the batched lines in ``status`` (UNSENT ones past the window excluded)."""
        return [i for b in self.batches for i in b.line_indexes if b.status_of(i) is status]

    @property
    def receipts(self) -> list[UploadReceipt]:
        return [b.receipt for b in self.batches if b.receipt is not None]

    @property
    def committed_lines(self) -> int:
        return sum(len(b.line_indexes) for b in self.batches if b.status is BatchStatus.COMMITTED)

    @property
    def first_failure(self) -> BatchOutcome | None:
        return next((b for b in self.batches if b.status in (BatchStatus.REJECTED, BatchStatus.FAILED)), None)

    def summary(self) -> str:
        """One sentence: what committed, what failed, from where nothing was sent."""
        counts: dict[str, int] = {}
        for batch in self.batches:
            counts[batch.status.value] = counts.get(batch.status.value, 0) + len(batch.line_indexes)
        parts = [f"{n} lines {status}" for status, n in counts.items()]
        if self.unsent_from_line is not None:
            parts.append(f"lines from {self.unsent_from_line + 1} on never sent")
        return "; ".join(parts) if parts else "nothing sent"
