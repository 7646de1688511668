"""A run's lifecycle on the platform (contract §10): created or attached, updated, closed.

An evaluation resolves its environments through the hub, is created with its
config as metadata, gets its summary as metrics, and is finalized (completed)
or closed with ``FAILED`` / ``CANCELLED`` and the error (a crash is ``FAILED``
with ``crashed: ...``). A training run is created for a team and a base model,
sends its metrics one step at a time, and is finalized or marked ``failed``
with the reason (``cancelled: ...``, ``crashed: ...``); the platform keeps no
summary of it. A run attached to by id (a launcher created it) is finalized
by a clean finish, but a failure is left to the launcher to record. A 409 on
a status change means the run was closed already: that is no error.
"""

from __future__ import annotations

import functools
import logging
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prime_runs.errors import ConfigurationError, EnvironmentResolutionError
from prime_runs.models import EnvironmentRef, RunStatus, TrainingSpec
from prime_traces.errors import APIError, TransportError
from prime_traces.platform import PlatformClient
from prime_traces.threads import DaemonPool

logger = logging.getLogger(__name__)

#: A training run's metrics go one step a request; this many at once.
METRICS_REQUESTS_IN_FLIGHT = 4


@dataclass(frozen=True)
class RunSpec:
    """What ``init()`` was told about a run, as the platform needs it to create one (and ``run.json`` keeps it)."""

    kind: str
    name: str | None = None
    environments: tuple[EnvironmentRef, ...] = ()
    model: str | None = None
    framework: str | None = None
    description: str | None = None
    tags: tuple[str, ...] = ()
    team_id: str | None = None
    training: TrainingSpec | None = None
    config: Mapping[str, Any] = field(default_factory=dict)

    def upload_context(self) -> dict[str, str]:
        """The upload context of the run's records (contract §7): where they come from."""
        context = {"source": "prime-runs", "run_type": self.kind}
        if self.framework:
            context["framework"] = self.framework
        if self.model:
            context["model"] = self.model
        return context

    def to_dict(self) -> dict[str, Any]:
        """What ``run.json`` keeps of it, so that ``prime-runs sync`` can create the run later."""
        return {
            "environments": [env.to_dict() for env in self.environments],
            "model": self.model,
            "framework": self.framework,
            "description": self.description,
            "team_id": self.team_id,
            "training": self.training.to_dict() if self.training is not None else None,
        }


@dataclass(frozen=True)
class Handle:
    """A run on the platform: its id, the name it has there, and its page."""

    id: str
    name: str | None
    url: str | None


class PlatformRuns:
    """One kind of run on the platform; :func:`runs_for` picks the kind. Thread-safe as its client is."""

    kind = "eval"

    def __init__(self, client: PlatformClient, *, team_id: str | None = None) -> None:
        self.client = client
        self.team_id = team_id

    def create(self, spec: RunSpec, deadline_s: float | None = None) -> Handle:
        raise NotImplementedError

    def attach(self, run_id: str) -> Handle:
        """A run a launcher created: no request (its first write proves access)."""
        return Handle(run_id, None, self.url_for(run_id))

    def url_for(self, run_id: str) -> str:
        return self.client.evaluation_url(run_id)

    def send_changes(
        self, run_id: str, config: Mapping[str, Any] | None, summary: Mapping[str, Any] | None, deadline_s: float
    ) -> None:
        """Send what changed of the run's config and summary (where the platform keeps them)."""

    def close(
        self,
        run_id: str,
        status: RunStatus,
        error: str | None,
        *,
        config: Mapping[str, Any] | None,
        summary: Mapping[str, Any] | None,
        attached: bool,
        deadline_s: float,
    ) -> bool:
        """Record the terminal status; False when the platform had closed the run already."""
        raise NotImplementedError

    def send_metrics(self, run_id: str, rows: Sequence[Mapping[str, Any]], deadline_s: float) -> bool:
        """Send metrics rows; False when the platform keeps no metrics history for this kind of run."""
        return False


class EvalRuns(PlatformRuns):
    """Evaluations: ``POST /evaluations/``, ``PUT /evaluations/{id}``, ``POST .../finalize``."""

    kind = "eval"

    def create(self, spec: RunSpec, deadline_s: float | None = None) -> Handle:
        environments = [self._resolve(env, spec.team_id) for env in spec.environments]
        if not environments:
            raise ConfigurationError(
                'An eval run needs at least one environment. Pass environments=["my-env"] to init().'
            )
        first = spec.environments[0].label
        name = spec.name or f"{first or spec.framework or 'eval'}-{uuid.uuid4().hex[:8]}"
        body: dict[str, Any] = {"name": name, "environments": environments, "tags": list(spec.tags)}
        optional = {
            "model_name": spec.model,
            "dataset": first or None,
            "framework": spec.framework,
            "description": spec.description,
            "metadata": dict(spec.config) or None,
            "team_id": spec.team_id if spec.team_id is not None else self.team_id,
        }
        body.update({key: value for key, value in optional.items() if value is not None})
        answer = self.client.create_evaluation(body, deadline_s=deadline_s)
        run_id = str(answer["evaluation_id"])
        return Handle(run_id, str(answer.get("name") or name), answer.get("viewer_url") or self.url_for(run_id))

    def _resolve(self, env: EnvironmentRef, team_id: str | None) -> dict[str, str]:
        try:
            if env.id:
                found = env.id
            elif env.slug:
                found = self.client.latest_environment(env.slug)
            else:
                assert env.name is not None
                found = self.client.resolve_environment(env.name, team_id if team_id is not None else self.team_id)
        except APIError as err:
            raise EnvironmentResolutionError(f"Could not resolve environment {env.label!r}: {err}") from err
        entry = {"id": found}
        if env.version_id:
            entry["version_id"] = env.version_id
        return entry

    def send_changes(
        self, run_id: str, config: Mapping[str, Any] | None, summary: Mapping[str, Any] | None, deadline_s: float
    ) -> None:
        self.client.update_evaluation(run_id, metadata=config, metrics=summary, deadline_s=deadline_s)

    def close(
        self,
        run_id: str,
        status: RunStatus,
        error: str | None,
        *,
        config: Mapping[str, Any] | None,
        summary: Mapping[str, Any] | None,
        attached: bool,
        deadline_s: float,
    ) -> bool:
        deadline = time.monotonic() + deadline_s
        try:
            # The launcher that created an attached run keeps its config; its summary is ours to send.
            metadata = None if attached else config
            self.client.update_evaluation(run_id, metadata=metadata, metrics=summary, deadline_s=deadline_s)
        except APIError as err:
            logger.warning("run %s: config/summary update failed (%s); still marking it %s", run_id, err, status.value)
        if status is RunStatus.COMPLETED:
            self.client.finalize_evaluation(run_id, summary, deadline_s=_left(deadline))
            return True
        if attached:
            logger.info("run %s: %s, but the launcher of an attached run records its failure", run_id, status.value)
            return True
        if status is RunStatus.CRASHED:
            error = f"crashed: {error}" if error else "crashed"
        closed = "CANCELLED" if status is RunStatus.CANCELLED else "FAILED"
        if not self.client.close_evaluation(run_id, closed, error, deadline_s=_left(deadline)):
            logger.info("run %s is already closed on the platform; not marking it %s", run_id, status.value)
        return True


class TrainingRuns(PlatformRuns):
    """External training runs: ``POST /rft/external-runs``, ``/rft/metrics``, ``/rft/finalize``, the status PUT."""

    kind = "train"

    def url_for(self, run_id: str) -> str:
        return self.client.training_url(run_id)

    def create(self, spec: RunSpec, deadline_s: float | None = None) -> Handle:
        if not spec.model:
            raise ConfigurationError("A training run needs model= — the base model being trained.")
        team = spec.team_id or self.team_id
        if not team:
            raise ConfigurationError(
                "A training run needs a team: pass team_id= or set PRIME_TEAM_ID. External training runs "
                "are created for a team, and the platform enables them per team."
            )
        training = spec.training or TrainingSpec()
        environments = []
        for env in spec.environments:
            entry = {"id": env.id or env.slug or env.name or ""}
            if env.version_id:
                entry["version_id"] = env.version_id
            environments.append(entry)
        body: dict[str, Any] = {
            "base_model": spec.model,
            "max_steps": int(training.max_steps),
            "environments": environments,
            "team_id": team,
        }
        optional = {
            "name": spec.name,
            "batch_size": training.batch_size,
            "rollouts_per_example": training.rollouts_per_example,
            "seq_len": training.seq_len,
            "run_config": dict(spec.config) or None,
            "wandb_project": training.wandb_project,
            "wandb_entity": training.wandb_entity,
            "wandb_run_name": training.wandb_run_name,
        }
        body.update({key: value for key, value in optional.items() if value is not None})
        run = self.client.create_training_run(body, deadline_s=deadline_s)["run"]
        run_id = str(run["id"])
        # A platform that serves its own page names it (the local service does); else the dashboard's.
        url = run.get("url") or run.get("viewer_url") or self.url_for(run_id)
        return Handle(run_id, str(run.get("name") or spec.name or "") or None, url)

    def close(
        self,
        run_id: str,
        status: RunStatus,
        error: str | None,
        *,
        config: Mapping[str, Any] | None,
        summary: Mapping[str, Any] | None,
        attached: bool,
        deadline_s: float,
    ) -> bool:
        deadline = time.monotonic() + deadline_s
        if status is RunStatus.COMPLETED:
            try:
                self.client.finalize_training_run(run_id, deadline_s=deadline_s)
            except APIError as err:
                logger.warning("run %s could not be finalized (%s); falling back to a status update", run_id, err)
                self.client.close_training_run(run_id, "completed", deadline_s=_left(deadline))
            return True
        if attached:
            logger.info("run %s: %s, but the launcher of an attached run records its failure", run_id, status.value)
            return True
        message = error or status.value
        if status is not RunStatus.FAILED:
            message = f"{status.value}: {message}"
        if not self.client.close_training_run(run_id, "failed", message, deadline_s=deadline_s):
            logger.info("run %s is already closed on the platform; not marking it %s", run_id, status.value)
        return True

    def send_metrics(self, run_id: str, rows: Sequence[Mapping[str, Any]], deadline_s: float) -> bool:
        # One step a request (the platform keeps one row per step): a few at once, so that a run logging
        # many steps is not paced by one round trip each. Rows of one step are merged first, later values
        # winning, so no two requests of a step race. The first failure stops the rest, within one deadline.
        steps: dict[Any, dict[str, Any]] = {}
        for row in rows:
            merged = steps.setdefault(row["step"], {"step": row["step"], "time": row["time"], "metrics": {}})
            merged["metrics"].update(row["metrics"])
            merged["time"] = row["time"]
        deadline = time.monotonic() + deadline_s
        with DaemonPool(METRICS_REQUESTS_IN_FLIGHT, name="prime-runs-metrics-send") as pool:
            for done in pool.map(functools.partial(self._send_row, run_id, deadline), steps.values()):
                del done
        return True

    def _send_row(self, run_id: str, deadline: float, row: Mapping[str, Any]) -> None:
        metrics = {name: value for name, value in row["metrics"].items() if _finite(value)}
        metrics["step"] = row["step"]
        metrics["_timestamp"] = row["time"]
        left = deadline - time.monotonic()
        if left <= 0:
            raise TransportError("the metrics' deadline passed before this step was sent")
        self.client.post_training_metrics(run_id, metrics, deadline_s=left)


def _left(deadline: float) -> float:
    # What is left of a deadline for the next request; a sliver at least, so that it is tried.
    return max(0.1, deadline - time.monotonic())


def _finite(value: Any) -> bool:
    # The platform's history holds numbers: the strings a non-finite value travels as stay local.
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
        return False
    return not (isinstance(value, float) and not math.isfinite(value))


def runs_for(kind: str, client: PlatformClient, team_id: str | None = None) -> PlatformRuns:
    """The lifecycle of ``kind`` (``eval`` or ``train``) runs on ``client``'s platform."""
    return (TrainingRuns if kind == "train" else EvalRuns)(client, team_id=team_id)


def spec_from_document(document: Mapping[str, Any], kind: str) -> RunSpec:
    """The :class:`RunSpec` a run's ``run.json`` kept, to create the run on the platform later (sync)."""
    kept = document.get("spec") or {}
    training = kept.get("training")
    return RunSpec(
        kind=kind,
        name=document.get("name"),
        environments=tuple(EnvironmentRef.coerce(env) for env in kept.get("environments") or ()),
        model=kept.get("model"),
        framework=kept.get("framework"),
        description=kept.get("description"),
        tags=tuple(document.get("tags") or ()),
        team_id=kept.get("team_id"),
        training=TrainingSpec(**training) if isinstance(training, Mapping) else None,
        config=dict(document.get("config") or {}),
    )
