"""Runs of the published prime-runs 0.1.4, unchanged, against the local service: ``SCENARIO [RUN_ID]``.

Run with the interpreter of a virtualenv that has the published SDK (see
``_interop.py``); ``PRIME_API_KEY``, ``PRIME_API_BASE_URL`` and
``PRIME_TRACES_URL`` point it at the service. Prints one JSON object: what
the run says about itself.
"""

from __future__ import annotations

import json
import sys
import time

import prime_runs as pr


def episode(episode_id: str, step: int | None = None) -> dict:
    now = time.time()
    run = {"type": "train", "work": {"type": "train", "step": step}} if step is not None else {"type": "eval"}
    member = {
        "version": 1,
        "id": f"{episode_id}-t",
        "task": {"type": "qa", "data": {"idx": 0}},
        "agent": {"name": "solver", "trainable": True, "config": {"model": "m"}},
        "calls": [{"node": 1, "model": "m", "usage": {"prompt_tokens": 7, "completion_tokens": 3}}],
        "rewards": {"correct": {"score": 1.0, "weight": 1.0}},
        "timing": {"start": now, "scoring": {"start": now, "end": now + 0.5}},
    }
    return {"version": 1, "id": episode_id, "env": {"id": "gsm8k"}, "run": run, "ok": True, "traces": [member]}


def report(run: pr.Run) -> None:
    print(
        json.dumps(
            {
                "id": run.id,
                "url": run.url,
                "status": run.status.value,
                "finished": run.finished,
                "attached": run.attached,
                "errors": run.errors,
                "failed": run.failed_records,
                "dropped": run.dropped_records,
            }
        )
    )


def main(scenario: str, *args: str) -> None:
    if scenario == "eval":
        run = pr.init(name="published-eval", environments=["gsm8k"], model="m", config={"lr": 1e-6})
        run.log_episodes([episode(f"pe-{i}") for i in range(3)])
        run.update_summary({"seen": 3})
        run.finish({"avg_reward": 0.5})
    elif scenario == "eval-failed":
        run = pr.init(name="published-failed", environments=["owner/gsm8k"], model="m")
        run.log_episodes([episode("pf-0")])
        run.finish(status=pr.RunStatus.FAILED, error="ValueError: boom")
    elif scenario == "train":
        spec = pr.TrainingSpec(max_steps=3, batch_size=2, rollouts_per_example=2)
        run = pr.init(kind="train", name="published-train", model="m", team_id="team-1", training=spec)
        for step in range(3):
            run.log_metrics({"loss": 1 / (step + 1), "reward": step / 2}, step=step)
            run.log_episodes([episode(f"pt-{step}-{i}", step) for i in range(2)])
        run.finish()
    elif scenario == "attach":
        run = pr.init(kind="train", id=args[0])
        run.log_metrics({"loss": 0.5}, step=0)
        run.log_episodes([episode("pa-0", 0)])
        run.finish()
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    report(run)


if __name__ == "__main__":
    main(*sys.argv[1:])
