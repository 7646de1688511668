"""Who owns a run, that is, creates it and records its terminal status; and how a process finds its run.

Online, rank 0 (or a process with no ``RANK``) creates the run, or attaches
to ``id`` when given, and exports ``PRIME_RUN_ID`` so that processes it
starts log into the same run. Other ranks, and processes that attach through
an inherited ``PRIME_RUN_ID``, only upload: they never create or finish the
run, unless told to own it (``init(owner=True)`` / ``PRIME_RUN_OWNER=1``).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from prime_runs.errors import PrimeRunsError

logger = logging.getLogger(__name__)

ENV_RUN_ID = "PRIME_RUN_ID"
#: The kind of the run ``PRIME_RUN_ID`` names (its routes on the platform depend on it).
ENV_RUN_KIND = "PRIME_RUN_KIND"
ENV_RANK = "RANK"
#: ``1`` makes the process own the run it attaches to (a launcher that created it for rank 0); ``0`` never.
ENV_OWNER = "PRIME_RUN_OWNER"


@dataclass(frozen=True)
class RankInfo:
    """This process's rank, whether it owns the run's lifecycle, and the run it attaches to (if any).

    ``told``: the owner was named explicitly (``owner=`` or ``PRIME_RUN_OWNER``);
    an owner that merely attached to a run by id leaves a failure to whoever created it.
    """

    rank: int | None
    owner: bool
    run_id: str | None
    told: bool = False
    #: The kind of a run inherited through ``PRIME_RUN_ID``, when its process said.
    inherited_kind: str | None = None

    @property
    def attached(self) -> bool:
        """Whether the run exists already (named by ``id=`` or an inherited ``PRIME_RUN_ID``)."""
        return self.run_id is not None


# Run ids this process exported to PRIME_RUN_ID, by pid: a later init() in the
# same process starts a new run instead of attaching to its own earlier one.
_exported: dict[str, int] = {}


def export_run_id(run_id: str, kind: str | None = None) -> None:
    """Publish ``run_id`` (and its ``kind``) to processes this one starts."""
    os.environ[ENV_RUN_ID] = run_id
    if kind is not None:
        os.environ[ENV_RUN_KIND] = kind
    _exported[run_id] = os.getpid()


def _told(value: str | None) -> bool | None:
    text = (value or "").strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    return None


def rank_info(
    explicit_id: str | None, environ: Mapping[str, str] | None = None, *, owner: bool | None = None
) -> RankInfo:
    """Who owns the run, that is, creates it and records its terminal status.

    ``owner`` (else ``PRIME_RUN_OWNER=1``/``0``) decides when given. Otherwise
    a process with ``RANK`` other than 0 never owns the run, and neither does
    a process that attaches to the run named by an inherited ``PRIME_RUN_ID``
    (a worker started by the run's process, or rank 0 of a launcher that
    created the run: that launcher says ``PRIME_RUN_OWNER=1``). A process that
    starts a new run, or names one with ``id=``, owns it.
    """
    env = os.environ if environ is None else environ
    raw = env.get(ENV_RANK)
    inherited = env.get(ENV_RUN_ID) or None
    if inherited is not None and _exported.get(inherited) == os.getpid():
        inherited = None
    run_id = explicit_id or inherited
    told = owner if owner is not None else _told(env.get(ENV_OWNER))
    rank: int | None = None
    if raw is not None and raw.strip() != "":
        try:
            rank = int(raw)
        except ValueError:
            raise PrimeRunsError(f"{ENV_RANK}={raw!r} is not an integer") from None
    if rank not in (None, 0) and run_id is None:
        raise PrimeRunsError(
            f"{ENV_RANK}={rank} but no run to attach to: start this process from rank 0 after "
            f"prime_runs.init() (which exports {ENV_RUN_ID}), or pass id= / set {ENV_RUN_ID}"
        )
    attaching = explicit_id is None and inherited is not None
    kind = (env.get(ENV_RUN_KIND) or None) if attaching else None
    if told is not None:
        return RankInfo(rank, told, run_id, told=True, inherited_kind=kind)
    return RankInfo(rank, rank in (None, 0) and not attaching, run_id, inherited_kind=kind)


def new_run_id() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"
