"""verifiers 0.4.0 and prime-rl's way of calling the SDK, run in a virtualenv with verifiers and this project.

``check``: which prime_runs / prime_traces are imported. ``eval`` and
``abort``: verifiers' own platform hooks (``open_run``, ``log_episodes``,
``finish_run``, ``abort_run``) push an evaluation of verifiers ``Episode``
objects. ``train [RUN_ID]``: prime-rl's monitor (``init(kind="train", ...)``,
or ``init(id=...)`` to attach; ``log_metrics`` and ``log_episodes`` through
``asyncio.to_thread``; ``finish()``). ``validate RUN_ID``: every stored
episode of the run read back as a verifiers ``WireEpisode``. Each prints one
JSON object. ``PRIME_API_KEY`` and ``PRIME_TRACES_URL`` (and, for ``train``,
``PLATFORM_URL``) say where.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from types import SimpleNamespace
from typing import Any

STEPS = 3
PER_STEP = 2


def episodes(prefix: str, count: int, run_info: Any) -> list[Any]:
    from verifiers.v1 import AgentConfig, Episode, MessageNode, TaskData, Trace
    from verifiers.v1.episode import EnvInfo, GroupInfo
    from verifiers.v1.trace import AgentInfo, ModelCall, Reward, TraceTask
    from verifiers.v1.types import AssistantMessage, Usage, UserMessage

    made = []
    for i in range(count):
        task = TraceTask(type="TaskData", data=TaskData(idx=i, prompt=f"{i}+{i}?"))
        nodes = [
            MessageNode(message=UserMessage(content=f"{i}+{i}?"), token_ids=[1, 2, 3], mask=[False] * 3),
            MessageNode(parent=0, message=AssistantMessage(content=str(2 * i)), sampled=True, token_ids=[4, 5]),
        ]
        call = ModelCall(node=1, model="m", usage=Usage(prompt_tokens=3, completion_tokens=2))
        trace = Trace(
            task=task,
            agent=AgentInfo(config=AgentConfig()),
            nodes=nodes,
            calls=[call],
            rewards={"correct": Reward(score=1.0)},
            metrics={"len": 2.0},
            ok=True,
            is_completed=True,
        )
        episode = Episode(
            id=f"{prefix}-{i}", task=task, traces=[trace], ok=True, env=EnvInfo(id="gsm8k"), group=GroupInfo(id="g0")
        )
        episode.record_run(run_info)
        made.append(episode)
    return made


def check() -> dict[str, Any]:
    import verifiers.v1.utils.platform  # noqa: F401  (imports prime_runs.projection at module level)

    import prime_runs
    import prime_traces

    return {"prime_runs": prime_runs.__file__, "prime_traces": prime_traces.__file__, "version": prime_runs.__version__}


def _config(name: str) -> SimpleNamespace:
    run = SimpleNamespace(attach=None, name=name, id=None)
    run.assign_id = lambda run_id: setattr(run, "id", run_id)
    return SimpleNamespace(
        run=run, env=SimpleNamespace(taskset=SimpleNamespace(id="gsm8k")), model="m", num_rollouts=2, push=True
    )


def _said(run: Any, state: Any, config: Any) -> dict[str, Any]:
    return {
        "id": run.id,
        "assigned": config.run.id,
        "url": run.url,
        "status": run.status.value,
        "finished": run.finished,
        "errors": list(run.errors),
        "failed": dict(run.failed_records),
        "incomplete": state.incomplete,
    }


def evaluation(abort: bool) -> dict[str, Any]:
    from verifiers.v1.episode import EvalRunInfo
    from verifiers.v1.utils import platform

    config, state = _config("vf-abort" if abort else "vf-eval"), platform.PushState()
    run = platform.open_run(config, state, num_examples=4)
    logged = episodes("vf", 4, EvalRunInfo(id=config.run.id, name=config.run.name))
    for one in logged:
        platform.log_episodes(run, [one])
    if abort:
        platform.abort_run(run, RuntimeError("the eval broke"), state)
    else:
        platform.finish_run(run, logged, state)
    return _said(run, state, config)


async def train(platform_url: str, attach: str | None) -> dict[str, Any]:
    from verifiers.v1.episode import TrainRunInfo, TrainWorkInfo

    import prime_runs as pr

    if attach:
        kwargs: dict[str, Any] = {"id": attach}
    else:
        training = pr.TrainingSpec(max_steps=STEPS, batch_size=PER_STEP, rollouts_per_example=2, seq_len=128)
        config = {"model": {"name": "m"}, "max_steps": STEPS}
        kwargs = {"name": "rl-run", "model": "m", "environments": ["gsm8k"], "training": training, "config": config}
    mode = os.getenv(pr.MODE_ENV) or "online"
    run = await asyncio.to_thread(
        pr.init, kind="train", mode=mode, base_url=platform_url, finish_timeout=60.0, **kwargs
    )
    assert run.url, "an online run has a page"
    for step in range(STEPS):
        await asyncio.to_thread(run.log_metrics, {"loss": 1 / (step + 1), "entropy": 0.5}, step=step)
        work = TrainWorkInfo(step=step)
        logged = episodes(f"rl-{step}", PER_STEP, TrainRunInfo(id="prime-rl-own-id", name="rl", work=work))
        await asyncio.to_thread(run.log_episodes, logged)
    await asyncio.to_thread(run.finish)
    return {"id": run.id, "url": run.url, "attached": run.attached, "status": run.status.value, "errors": run.errors}


def validate(run_id: str) -> dict[str, Any]:
    import orjson
    import requests
    from verifiers.v1.episode import WireEpisode

    from prime_traces import TracesClient

    url, headers = os.environ["PRIME_TRACES_URL"], {"Authorization": f"Bearer {os.environ['PRIME_API_KEY']}"}

    def raw(path: str) -> Any:
        resp = requests.get(f"{url}/api/v1/{path}", params={"raw": "true"}, headers=headers, timeout=30)
        resp.raise_for_status()
        return orjson.loads(resp.content)

    steps: dict[str, Any] = {}
    with TracesClient() as client:
        found = list(client.iter_episodes(run_id=run_id, limit=100))
        for summary in found:
            envelope = raw(f"episodes/{summary.episode_id}")
            envelope["traces"] = [raw(f"traces/{trace_id}") for trace_id in envelope["traces"]]
            parsed = WireEpisode.model_validate(envelope)
            work = getattr(parsed.run, "work", None)
            steps[summary.episode_id] = getattr(work, "step", None)
        tokens = sorted({t.total_tokens for t in client.iter(run_id=run_id)})
        by_step = {step: len(list(client.iter_episodes(run_id=run_id, run_step=step))) for step in range(STEPS)}
    return {"validated": len(found), "steps": steps, "tokens": tokens, "by_step": by_step}


def main(command: str, *args: str) -> None:
    if command == "check":
        out = check()
    elif command in ("eval", "abort"):
        out = evaluation(abort=command == "abort")
    elif command == "train":
        out = asyncio.run(train(os.environ["PLATFORM_URL"], args[0] if args else None))
    elif command == "validate":
        out = validate(args[0])
    else:
        raise SystemExit(f"unknown command {command!r}")
    print(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:])
