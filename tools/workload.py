"""Seeded, deterministic generator of realistic agentic RL episodes.

An episode is the envelope of wire contract §7 with one to four member traces
shaped like verifiers v1 ``to_record()`` output: a system and user prompt, then
turns of assistant messages (reasoning, text, code, tool calls) and tool
results, one ``calls[]`` entry per sampled message carrying the completion's
``token_ids`` and ``logprobs`` (most of the bytes, as in real RL data).
Text is word-based prose, code and tool output with some accented, CJK and
emoji text, so it compresses like real JSON (gzip-1 around 3-6x).

    episode = generate_episode(7, target_bytes=2_200_000, now=1.75e9)
    for line in encoded_lines(iter_episodes(100, seed=1, steps=10)):
        sink.write(line)

The same seed and ``now`` always give the same episode; the orjson encoding
is within ``SIZE_TOLERANCE`` of ``target_bytes`` from ~10 KB to ~140 MB.
Depends only on the standard library and orjson, so benchmarks can import it
with ``sys.path.insert(0, "tools")``.
"""

from __future__ import annotations

import array
import itertools
import random
import sys
import time
import uuid
from collections.abc import Iterable, Iterator

import orjson

DEFAULT_TARGET_BYTES = 2_200_000
DEFAULT_RUN_ID = "run-bench"
SIZE_TOLERANCE = 0.10
_MAX_SPAN_S = 2400.0  # whole episode, so timing.start fits in the hour before `now`
_VOCAB_SIZE = 151_936

_WORDS = (
    "the of and to a in is that for it as with was on be by this are or from at which an not have "
    "has but we if then so first next check whether value function return error test case result "
    "file path list index loop count total input output string number reward model step token call "
    "tool answer question because therefore let need should could would expected actual fails passes "
    "import module class method argument parameter config cache buffer queue worker thread request "
    "response batch update fix bug edge empty none true false line column parse compute sort merge"
).split()
_EXOTIC = (
    "café naïve résumé Zürich façade jalapeño Ångström Müller São_Paulo déjà_vu "
    "数据 模型训练 函数 错误处理 测试用例 こんにちは ありがとう 한국어 서버 "
    "🚀 ✅ ❌ 🤖 🔥 📦 🐍 💡 ⚠️ → ≤ π Δ µs"
).split()
_IDENTS = "data items result value node cache config parser buf idx count total path key payload batch".split()
_MODELS = ("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B-Instruct", "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B")
_AGENTS = (("solver", True), ("critic", False), ("judge", False), ("planner", True))
_TOOL_NAMES = ("bash", "read_file", "write_file", "run_tests", "search_code")
_STOPS = ("completed", "completed", "completed", "max_turns", "max_output_tokens")


def _zipf_word(rng: random.Random) -> str:
    if rng.random() < 0.04:
        return rng.choice(_EXOTIC).replace("_", " ")
    return _WORDS[int(len(_WORDS) * rng.random() ** 2.2)]


def _sentence(rng: random.Random) -> str:
    words = [_zipf_word(rng) for _ in range(rng.randint(5, 22))]
    if rng.random() < 0.3:
        words[rng.randrange(len(words))] = f"`{rng.choice(_IDENTS)}_{rng.choice(_IDENTS)}()`"
    if rng.random() < 0.2:
        words[rng.randrange(len(words))] = str(rng.randint(0, 10_000))
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice(".....?:!")


def _prose(rng: random.Random) -> str:
    return " ".join(_sentence(rng) for _ in range(rng.randint(2, 7)))


def _code(rng: random.Random) -> str:
    name, arg, var = (f"{rng.choice(_IDENTS)}_{rng.choice(_IDENTS)}" for _ in range(3))
    return (
        f"```python\ndef {name}({arg}: list[int], limit: int = {rng.randint(1, 512)}) -> int:\n"
        f'    """{_sentence(rng)}"""\n    {var} = 0\n'
        f"    for i, item in enumerate({arg}):\n        if item > limit and i % {rng.randint(2, 9)} == 0:\n"
        f"            {var} += item  # {_zipf_word(rng)} {_zipf_word(rng)}\n"
        f"    return {var}\n```"
    )


def _tool_output(rng: random.Random) -> str:
    mod = f"{rng.choice(_IDENTS)}_{rng.choice(_IDENTS)}"
    kind = rng.randrange(4)
    if kind == 0:
        passed, failed = rng.randint(0, 60), rng.randint(0, 4)
        return (
            f"$ pytest -q tests/test_{mod}.py\n{'.' * passed}{'F' * failed}\n"
            f"FAILED tests/test_{mod}.py::test_{rng.choice(_IDENTS)} - AssertionError: "
            f"assert {rng.randint(0, 99)} == {rng.randint(0, 99)}\n"
            f"{failed} failed, {passed} passed in {rng.uniform(0.05, 9):.2f}s"
        )
    if kind == 1:
        return "\n".join(
            f"-rw-r--r-- 1 agent agent {rng.randint(0, 90_000):>6} Jan {rng.randint(1, 31):>2} "
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} {rng.choice(_IDENTS)}_{rng.choice(_IDENTS)}.py"
            for _ in range(rng.randint(3, 14))
        )
    if kind == 2:
        return (
            f'Traceback (most recent call last):\n  File "/workspace/src/{mod}.py", line {rng.randint(1, 900)}, '
            f"in {rng.choice(_IDENTS)}\n    {rng.choice(_IDENTS)} = {rng.choice(_IDENTS)}[{rng.choice(_IDENTS)}]\n"
            f"KeyError: '{_zipf_word(rng)}'"
        )
    return f"--- a/src/{mod}.py\n+++ b/src/{mod}.py\n@@ -{rng.randint(1, 400)},7 +{rng.randint(1, 400)},9 @@\n" + "\n".join(
        f"{rng.choice('+- ')}    {rng.choice(_IDENTS)} = {rng.choice(_IDENTS)}({rng.randint(0, 64)})" for _ in range(rng.randint(4, 12))
    )


class _Tables:
    """Fixed lookup tables that turn random bytes into token ids and logprobs at C speed."""

    def __init__(self) -> None:
        rng = random.Random(0x5EED)
        # Completions repeat phrases (n-grams of Zipf-like ids, frequent ones small as
        # in BPE vocabularies), and a few phrases are far more common than the rest.
        phrases = [[int(_VOCAB_SIZE * rng.random() ** 4) for _ in range(rng.randint(1, 8))] for _ in range(4096)]
        self.phrases = [phrases[int(4096 * rng.random() ** 3)] for _ in range(65536)]
        self.phrase_len = sum(map(len, self.phrases)) / 65536
        self.token_ids = [i for phrase in self.phrases for i in phrase]
        # Sampled tokens are mostly near-certain: float32 logprobs that are 0 or a few ulps below it.
        raw = [
            -rng.randint(0, 12) * 2.0**-24 if rng.random() < 0.65 else -rng.expovariate(1.2) ** 2 for _ in range(65536)
        ]
        self.logprobs = array.array("f", raw).tolist()
        self.token_bytes = len(orjson.dumps(self.token_ids)) / len(self.token_ids)  # per element, comma included
        self.logprob_bytes = len(orjson.dumps(self.logprobs)) / 65536


_tables: _Tables | None = None


class _Material:
    """Per-episode pools of text, and fresh token arrays drawn through `_Tables`."""

    def __init__(self, rng: random.Random, target_bytes: int) -> None:
        global _tables
        if _tables is None:
            _tables = _Tables()
        self.tables = _tables
        n = max(24, min(400, target_bytes // 8000))
        self.prose = [_prose(rng) for _ in range(n)]
        self.code = [_code(rng) for _ in range(max(6, n // 5))]
        self.tool = [_tool_output(rng) for _ in range(max(8, n // 3))]

    def text(self, rng: random.Random, n_chars: int, code_share: float = 0.0) -> str:
        parts, size = [], 0
        while size < n_chars:
            part = rng.choice(self.code if rng.random() < code_share else self.prose)
            parts.append(part)
            size += len(part) + 2
        return "\n\n".join(parts)

    def tokens(self, rng: random.Random, n: int) -> tuple[list[int], list[float]]:
        tables = self.tables
        picks = array.array("H", rng.randbytes(2 * int(n / tables.phrase_len + 8)))
        lps = array.array("H", rng.randbytes(2 * n))
        if sys.byteorder == "big":  # same output on every platform
            picks.byteswap()
            lps.byteswap()
        ids = list(itertools.chain.from_iterable(map(tables.phrases.__getitem__, picks)))
        while len(ids) < n:
            ids.extend(tables.phrases[rng.randrange(65536)])
        del ids[n:]
        return ids, list(map(tables.logprobs.__getitem__, lps))

    def array_bytes(self, n: int) -> float:
        return n * (self.tables.token_bytes + self.tables.logprob_bytes) + 27  # keys and brackets


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _tool_schema(name: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Run {name.replace('_', ' ')} inside the task sandbox and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "command": {"type": "string"}, "timeout_s": {"type": "number"}},
                "required": ["command"],
            },
        },
    }


class _TraceBuilder:
    """Appends turns to one trace until its byte budget is spent."""

    def __init__(self, rng: random.Random, mat: _Material, trace: dict, budget: float, t0: float, span_s: float):
        self.rng, self.mat, self.trace, self.budget = rng, mat, trace, budget
        self.clock, self.context = t0, 0
        turns = max(1, min(400, round(budget**0.5 / 25)))
        self.mean_tokens = max(8, budget / turns / 36)
        est_tokens = budget / 34
        self.tps = max(rng.uniform(40, 120), est_tokens / (0.8 * span_s))

    def _turn(self, n_tokens: int, last: bool) -> tuple[list[dict], dict, int]:
        rng, mat, nodes = self.rng, self.mat, self.trace["nodes"]
        index = len(nodes)
        reasoning = mat.text(rng, int(n_tokens * 2.4))
        message: dict = {"role": "assistant", "content": mat.text(rng, int(n_tokens * 1.6), 0.3 if last else 0.1)}
        message["reasoning_content"] = reasoning
        new_nodes = [{"message": message, "parent": index - 1, "sampled": True}]
        finish = rng.choice(("stop", "stop", "stop", "length")) if last else "tool_calls"
        if not last:
            calls = []
            for _ in range(1 if rng.random() < 0.8 else 2):
                call_id = f"call_{rng.getrandbits(64):016x}"
                args = {"command": f"{rng.choice(_TOOL_NAMES)} src/{rng.choice(_IDENTS)}.py", "timeout_s": rng.randint(5, 120)}
                calls.append({"id": call_id, "type": "function", "function": {"name": rng.choice(_TOOL_NAMES), "arguments": orjson.dumps(args).decode()}})
                out = "\n".join(rng.choice(mat.tool) for _ in range(max(1, int(n_tokens * rng.uniform(0.4, 2.0)) // 500)))
                new_nodes.append({"message": {"role": "tool", "tool_call_id": call_id, "content": out}, "parent": index, "sampled": False})
            message["tool_calls"] = calls
        start = self.clock
        end = start + n_tokens / self.tps + rng.uniform(0.05, 0.6)
        self.clock = end + rng.uniform(0.05, 2.0)
        call = {
            "node": index,
            "model": self.trace["agent"]["config"]["model"],
            "endpoint": "chat/completions",
            "finish_reason": finish,
            "usage": {"input_tokens": self.context, "completion_tokens": n_tokens, "total_tokens": self.context + n_tokens},
            "time": {"start": round(start, 6), "end": round(end, 6)},
        }
        size = sum(len(orjson.dumps(node)) + 1 for node in new_nodes) + len(orjson.dumps(call)) + 1
        return new_nodes, call, size + round(mat.array_bytes(n_tokens))

    def fill(self) -> None:
        rng, trace, used, turn = self.rng, self.trace, 0.0, 0
        per_token = 36.0
        while True:
            remaining = self.budget - used
            last = remaining < 1.6 * (self.mean_tokens * per_token + 600) or turn >= 2000
            n = self.mean_tokens * rng.uniform(0.4, 1.6) if not last else (remaining - 600) / per_token
            for _ in range(4):  # the last turn is resized until it lands on the budget
                nodes, call, size = self._turn(max(1, int(n)), last)
                if not last or abs(size - remaining) < 0.01 * self.budget + 200 or n < 2:
                    break
                n += (remaining - size) / per_token
            per_token = max(20.0, (size - 600) / max(1, int(n))) if n > 50 else per_token
            self.context += call["usage"]["completion_tokens"] + sum(len(x["message"]["content"]) // 4 for x in nodes[1:])
            call["token_ids"], call["logprobs"] = self.mat.tokens(rng, call["usage"]["completion_tokens"])
            trace["nodes"].extend(nodes)
            trace["calls"].append(call)
            used += size
            turn += 1
            if last:
                break
        if call["finish_reason"] == "length":
            trace["stop_condition"] = "max_output_tokens"


def _trace_skeleton(rng: random.Random, mat: _Material, episode: dict, agent: tuple[str, bool], size_hint: int) -> dict:
    name, trainable = agent
    tools = [_tool_schema(t) for t in _TOOL_NAMES[: 2 if size_hint < 40_000 else 5]]
    system = mat.text(rng, min(2400, size_hint // 25))
    rewards = {"correctness": {"score": float(rng.random() < 0.5), "weight": 1.0}, "format": {"score": round(rng.random(), 4), "weight": 0.1}}
    if rng.random() < 0.2:
        rewards["judge"] = None
    return {
        "version": 1,
        "id": _uuid(rng),
        "task": episode["task"],
        "agent": {"name": name, "trainable": trainable, "config": {"model": rng.choice(_MODELS), "client": {"base_url": "https://api.pinference.ai/api/v1"}, "sampling": {"temperature": 1.0, "max_tokens": 8192}}},
        "run": {"id": episode["run"]["id"], "type": "train", "work": dict(episode["run"]["work"]), "repetition_index": rng.randrange(8)},
        "nodes": [
            {"message": {"role": "system", "content": system}, "parent": None, "sampled": False},
            {"message": {"role": "user", "content": episode["task"]["data"]["prompt"]}, "parent": 0, "sampled": False},
        ],
        "calls": [],
        "tools": tools,
        "rewards": rewards,
        "metrics": {"num_turns": 0, "num_tool_calls": 0, "completion_tokens": 0, "sandbox_cpu_s": round(rng.uniform(1, 300), 3)},
        "info": {"sandbox": {"image": "python:3.11-slim", "id": f"sbx-{rng.getrandbits(48):012x}"}, "attempt": 0},
        "is_completed": True,
        "ok": True,
        "stop_condition": rng.choice(_STOPS),
        "errors": [],
        "timing": {},
    }


def generate_episode(
    rng_or_seed: random.Random | int | str | bytes,
    *,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    run_id: str = DEFAULT_RUN_ID,
    step: int = 0,
    now: float | None = None,
) -> dict:
    """Return one episode envelope whose orjson encoding is ``target_bytes`` ±10%.

    ``rng_or_seed`` is a ``random.Random`` (advanced in place) or a seed. Every
    ``timing.start`` and call time falls within the hour before ``now``
    (default: ``time.time()`` read once). No mutable container is shared
    between two places in the document.
    """
    if target_bytes < 5_000:
        raise ValueError("target_bytes must be at least 5000")
    rng = rng_or_seed if isinstance(rng_or_seed, random.Random) else random.Random(rng_or_seed)
    now = time.time() if now is None else float(now)
    mat = _Material(rng, target_bytes)
    idx = rng.randrange(100_000)
    task = {
        "type": "swe",
        "data": {"prompt": mat.text(rng, min(3000, target_bytes // 40), 0.3), "idx": idx, "name": f"{rng.choice(_IDENTS)}-{idx}"},
        "key": f"task-{idx}",
        "hash": f"{rng.getrandbits(256):064x}",
    }
    work = {"type": "step", "step": step}
    episode = {"version": 1, "id": _uuid(rng), "env": {"id": "swe-gym", "name": "SWE Gym"}, "task": task,
               "group": {"id": _uuid(rng)}, "run": {"id": run_id, "type": "train", "name": "bench", "work": work},
               "ok": True, "errors": [], "outcome": "", "info": {}, "traces": []}  # fmt: skip
    n_traces = 1 if target_bytes < 60_000 else rng.choice((1, 2, 2, 3, 4))
    agents = [_AGENTS[0]] + rng.sample(_AGENTS[1:], n_traces - 1)
    traces = [_trace_skeleton(rng, mat, episode, agent, target_bytes // n_traces) for agent in agents]
    for trace in traces:
        trace["task"] = dict(task, data=dict(task["data"]))
    # Provisional absolute times keep the sizes right; everything is shifted at the end.
    t0 = now - _MAX_SPAN_S - 900
    timing_bytes = 300  # timing numbers and final metrics, added after the turns
    fixed = len(orjson.dumps(dict(episode, traces=traces))) + timing_bytes * n_traces
    weights = [rng.uniform(0.5, 1.5) for _ in traces]
    budget = max(0, target_bytes - fixed)
    clock = t0
    for trace, weight in zip(traces, weights):
        start = clock
        boot, setup = rng.uniform(0.5, 8), rng.uniform(0.2, 5)
        builder = _TraceBuilder(rng, mat, trace, budget * weight / sum(weights), start + boot + setup, _MAX_SPAN_S / n_traces)
        builder.fill()
        agent_s = builder.clock - (start + boot + setup)
        finalize = rng.uniform(0.1, 2)
        score_start = builder.clock + finalize
        score_end = score_start + rng.uniform(0.05, 20)
        trace["timing"] = {"start": start, "boot": round(boot, 6), "setup": round(setup, 6), "agent": round(agent_s, 6),
                           "finalize": round(finalize, 6), "scoring": {"start": score_start, "end": score_end}}  # fmt: skip
        calls = trace["calls"]
        trace["metrics"].update(num_turns=len(calls), num_tool_calls=sum(len(n["message"].get("tool_calls") or ()) for n in trace["nodes"]),
                                completion_tokens=sum(c["usage"]["completion_tokens"] for c in calls))  # fmt: skip
        clock = score_end + rng.uniform(0.1, 3)
    span = clock - t0
    shift = now - rng.uniform(span + 1, max(span + 2, 3590)) - t0
    for trace in traces:
        timing = trace["timing"]
        timing["start"] = round(timing["start"] + shift, 6)
        timing["scoring"] = {k: round(v + shift, 6) for k, v in timing["scoring"].items()}
        for call in trace["calls"]:
            call["time"] = {k: round(v + shift, 6) for k, v in call["time"].items()}
    reward = sum(r["score"] * r["weight"] for r in traces[0]["rewards"].values() if r)
    episode["outcome"] = "truncated" if traces[0]["stop_condition"] != "completed" else ("success" if reward >= 1 else "failure")
    episode["traces"] = traces
    return episode


def iter_episodes(
    n: int,
    *,
    seed: int | str = 0,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    run_id: str = DEFAULT_RUN_ID,
    steps: int = 1,
    now: float | None = None,
) -> Iterator[dict]:
    """Yield ``n`` episodes spread evenly over training steps ``0..steps-1``.

    Episode ``i`` is generated from a sub-seed drawn from ``random.Random(seed)``
    and sits at step ``i * steps // n``; ``now`` is read once for the batch.
    """
    if n < 0 or steps < 1:
        raise ValueError("n must be >= 0 and steps >= 1")
    rng = random.Random(seed)
    now = time.time() if now is None else float(now)
    for i in range(n):
        sub_seed = rng.getrandbits(64)
        yield generate_episode(sub_seed, target_bytes=target_bytes, run_id=run_id, step=i * steps // n, now=now)


def encoded_lines(episodes: Iterable[dict]) -> Iterator[bytes]:
    """Yield each episode as compact orjson followed by ``b"\\n"`` (one JSONL line)."""
    for episode in episodes:
        yield orjson.dumps(episode) + b"\n"


if __name__ == "__main__":
    import zlib

    for target in (10_000, 2_200_000, 8_500_000, 35_000_000, 133_000_000):
        began = time.perf_counter()
        built = generate_episode(0, target_bytes=target, now=1.75e9)
        elapsed = time.perf_counter() - began
        line = orjson.dumps(built)
        ratio = len(line) / len(zlib.compress(line, 1))
        print(f"target {target:>11,}  actual {len(line):>11,} ({len(line) / target - 1:+.1%})  "
              f"traces {len(built['traces'])}  turns {sum(len(t['calls']) for t in built['traces']):>5}  "
              f"gzip-1 {ratio:.2f}x  built in {elapsed:.2f}s")  # fmt: skip
