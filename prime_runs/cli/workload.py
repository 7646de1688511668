"""Seeded, deterministic generator of realistic agentic RL episodes.

An episode is the envelope of wire contract §7 holding one to four member traces
shaped like verifiers v1 ``to_record()`` output: a system and a user prompt, then
turns of assistant messages (reasoning, text, code, tool calls) and tool results,
with one ``calls[]`` entry per sampled message carrying the completion's
``token_ids`` and ``logprobs``, most of the bytes as in real RL data. Text is
word-based prose, code and tool output with some accented, CJK and emoji text;
an episode compresses like real JSON (gzip-1 about 3.5x, 2.5x when tiny).

    episode = generate_episode(7, target_bytes=2_200_000, now=1.75e9)
    for line in encoded_lines(iter_episodes(100, seed=1, steps=10)):
        sink.write(line)

The same seed and ``now`` always give the same episode, whose orjson encoding is
within ``SIZE_TOLERANCE`` of ``target_bytes`` from 10 KB to 140 MB (133 MB builds
in about a second). It lives in the package so that ``prime-runs demo`` can
use it; benchmarks import it as ``tools/workload.py``.
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
_MIN_TARGET_BYTES = 5_000
_MAX_SPAN_S = 2400.0  # the whole episode, so that it fits in the hour before `now`
_VOCAB_SIZE = 151_936
_TABLE_SIZE = 65536  # indexed by two random bytes

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
_MODELS = ("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B-Instruct", "deepseek-ai/DeepSeek-R1")
_AGENTS = (("solver", True), ("critic", False), ("judge", False), ("planner", True))
_TOOL_NAMES = ("bash", "read_file", "write_file", "run_tests", "search_code")
_STOPS = ("completed", "completed", "completed", "max_turns", "max_output_tokens")


def _word(rng: random.Random) -> str:
    if rng.random() < 0.04:
        return rng.choice(_EXOTIC).replace("_", " ")
    return _WORDS[int(len(_WORDS) * rng.random() ** 2.2)]  # frequent words first, as in real text


def _ident(rng: random.Random) -> str:
    return f"{rng.choice(_IDENTS)}_{rng.choice(_IDENTS)}"


def _sentence(rng: random.Random) -> str:
    words = [_word(rng) for _ in range(rng.randint(5, 22))]
    if rng.random() < 0.3:
        words[rng.randrange(len(words))] = f"`{_ident(rng)}()`"
    if rng.random() < 0.2:
        words[rng.randrange(len(words))] = str(rng.randint(0, 10_000))
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice(".....?:!")


def _prose(rng: random.Random) -> str:
    return " ".join(_sentence(rng) for _ in range(rng.randint(2, 7)))


def _code(rng: random.Random) -> str:
    name, arg, var = _ident(rng), _ident(rng), _ident(rng)
    return (
        f"```python\ndef {name}({arg}: list[int], limit: int = {rng.randint(1, 512)}) -> int:\n"
        f'    """{_sentence(rng)}"""\n    {var} = 0\n'
        f"    for i, item in enumerate({arg}):\n        if item > limit and i % {rng.randint(2, 9)} == 0:\n"
        f"            {var} += item  # {_word(rng)} {_word(rng)}\n"
        f"    return {var}\n```"
    )


def _tool_output(rng: random.Random) -> str:
    mod, kind = _ident(rng), rng.randrange(4)
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
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} {_ident(rng)}.py"
            for _ in range(rng.randint(3, 14))
        )
    if kind == 2:
        return (
            f'Traceback (most recent call last):\n  File "/workspace/src/{mod}.py", line {rng.randint(1, 900)}, '
            f"in {rng.choice(_IDENTS)}\n    {_ident(rng)} = {rng.choice(_IDENTS)}[{rng.choice(_IDENTS)}]\n"
            f"KeyError: '{_word(rng)}'"
        )
    hunk = f"@@ -{rng.randint(1, 400)},7 +{rng.randint(1, 400)},9 @@"
    lines = (f"{rng.choice('+- ')}    {_ident(rng)} = {rng.choice(_IDENTS)}({rng.randint(0, 64)})" for _ in range(9))
    return f"--- a/src/{mod}.py\n+++ b/src/{mod}.py\n{hunk}\n" + "\n".join(lines)


class _Tables:
    """Fixed tables that turn random bytes into token ids and logprobs at C speed."""

    def __init__(self) -> None:
        rng = random.Random(0x5EED)
        # Completions repeat phrases: n-grams of Zipf-like ids (BPE vocabularies give
        # frequent tokens small ids), a few phrases far more common than the rest.
        phrases = [[int(_VOCAB_SIZE * rng.random() ** 4) for _ in range(rng.randint(1, 8))] for _ in range(4096)]
        self.phrases = [phrases[int(4096 * rng.random() ** 3)] for _ in range(_TABLE_SIZE)]
        self.phrase_len = sum(map(len, self.phrases)) / _TABLE_SIZE
        # A sampled token is mostly near-certain: a float32 logprob of 0 or a few ulps below.
        raw = [
            -rng.randint(0, 12) * 2.0**-24 if rng.random() < 0.72 else -(rng.expovariate(1.2) ** 2)
            for _ in range(_TABLE_SIZE)
        ]
        self.logprobs = array.array("f", raw).tolist()
        ids = [i for phrase in self.phrases for i in phrase]
        self.token_bytes = len(orjson.dumps(ids)) / len(ids)  # per element, comma included
        self.logprob_bytes = len(orjson.dumps(self.logprobs)) / _TABLE_SIZE


_tables: _Tables | None = None


class _Material:
    """One episode's pools of text, and fresh token arrays drawn through `_Tables`."""

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
        if sys.byteorder == "big":  # the same output on every platform
            picks.byteswap()
            lps.byteswap()
        ids = list(itertools.chain.from_iterable(map(tables.phrases.__getitem__, picks)))
        while len(ids) < n:
            ids.extend(tables.phrases[rng.randrange(_TABLE_SIZE)])
        del ids[n:]
        # Through arrays, so every number is an object of its own, as after json.loads.
        logprobs = array.array("d", map(tables.logprobs.__getitem__, lps)).tolist()
        return array.array("q", ids).tolist(), logprobs

    def array_bytes(self, n: int) -> float:
        return n * (self.tables.token_bytes + self.tables.logprob_bytes) + 27  # with keys and brackets


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _tool_schema(name: str) -> dict:
    properties = {"path": {"type": "string"}, "command": {"type": "string"}, "timeout_s": {"type": "number"}}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Run {name.replace('_', ' ')} inside the task sandbox and return its output.",
            "parameters": {"type": "object", "properties": properties, "required": ["command"]},
        },
    }


class _TraceBuilder:
    """Appends turns to one trace until its byte budget is spent."""

    def __init__(self, rng: random.Random, mat: _Material, trace: dict, budget: float, t0: float, span_s: float):
        self.rng, self.mat, self.trace, self.budget = rng, mat, trace, budget
        self.clock, self.context = t0, 0
        turns = max(1, min(400, round(budget**0.5 / 25)))  # longer episodes have more and longer turns
        self.mean_tokens = max(8, budget / turns / 36)
        self.tokens_per_s = max(rng.uniform(40, 120), budget / 34 / (0.8 * span_s))

    def _turn(self, n_tokens: int, last: bool) -> tuple[list[dict], dict, int]:
        rng, mat, index = self.rng, self.mat, len(self.trace["nodes"])
        content = mat.text(rng, int(n_tokens * 1.6), 0.3 if last else 0.1)
        reasoning = mat.text(rng, int(n_tokens * 2.4))
        message: dict = {"role": "assistant", "content": content, "reasoning_content": reasoning}
        nodes = [{"message": message, "parent": index - 1, "sampled": True}]
        if not last:
            message["tool_calls"] = []
            for _ in range(1 if rng.random() < 0.8 else 2):
                call_id = f"call_{rng.getrandbits(64):016x}"
                args = {"command": f"{rng.choice(_TOOL_NAMES)} src/{_ident(rng)}.py", "timeout_s": rng.randint(5, 120)}
                function = {"name": rng.choice(_TOOL_NAMES), "arguments": orjson.dumps(args).decode()}
                message["tool_calls"].append({"id": call_id, "type": "function", "function": function})
                parts = max(1, int(n_tokens * rng.uniform(0.4, 2)) // 500)
                output = "\n".join(rng.choice(mat.tool) for _ in range(parts))
                tool = {"role": "tool", "tool_call_id": call_id, "content": output}
                nodes.append({"message": tool, "parent": index, "sampled": False})
        start = self.clock
        end = start + n_tokens / self.tokens_per_s + rng.uniform(0.05, 0.6)
        self.clock = end + rng.uniform(0.05, 2.0)
        call = {
            "node": index,
            "model": self.trace["agent"]["config"]["model"],
            "endpoint": "chat/completions",
            "finish_reason": rng.choice(("stop", "stop", "stop", "length")) if last else "tool_calls",
            "usage": {
                "input_tokens": self.context,
                "completion_tokens": n_tokens,
                "total_tokens": self.context + n_tokens,
            },
            "time": {"start": round(start, 6), "end": round(end, 6)},
        }
        size = sum(len(orjson.dumps(node)) + 1 for node in nodes) + len(orjson.dumps(call)) + 1
        return nodes, call, size + round(mat.array_bytes(n_tokens))

    def fill(self) -> None:
        rng, trace, used, last = self.rng, self.trace, 0.0, False
        per_token = 36.0  # bytes per completion token in a turn, learnt as turns are built
        while not last:
            remaining = self.budget - used
            last = remaining < 1.6 * (self.mean_tokens * per_token + 600) or len(trace["calls"]) >= 2000
            n = (remaining - 600) / per_token if last else self.mean_tokens * rng.uniform(0.4, 1.6)
            for _ in range(4):  # the last turn is resized until it lands on the budget
                nodes, call, size = self._turn(max(1, int(n)), last)
                if not last or abs(size - remaining) < 0.01 * self.budget + 200 or n < 2:
                    break
                n += (remaining - size) / per_token
            if n > 50:
                per_token = max(20.0, (size - 600) / int(n))
            completion = call["usage"]["completion_tokens"]
            self.context += completion + sum(len(x["message"]["content"]) // 4 for x in nodes[1:])
            call["token_ids"], call["logprobs"] = self.mat.tokens(rng, completion)
            trace["nodes"].extend(nodes)
            trace["calls"].append(call)
            used += size
        if call["finish_reason"] == "length":
            trace["stop_condition"] = "max_output_tokens"


def _trace_skeleton(rng: random.Random, mat: _Material, episode: dict, agent: tuple[str, bool], size_hint: int) -> dict:
    task = dict(episode["task"], data=dict(episode["task"]["data"]))
    config = {
        "model": rng.choice(_MODELS),
        "client": {"base_url": "https://api.pinference.ai/api/v1"},
        "sampling": {"temperature": 1.0, "max_tokens": 8192},
    }
    run = {"id": episode["run"]["id"], "type": "train", "work": dict(episode["run"]["work"])}
    rewards: dict[str, dict[str, float] | None] = {
        "correctness": {"score": float(rng.random() < 0.5), "weight": 1.0},
        "format": {"score": round(rng.random(), 4), "weight": 0.1},
    }
    if rng.random() < 0.2:
        rewards["judge"] = None  # a reward function that gave no score
    system = mat.text(rng, min(2400, size_hint // 25))
    return {
        "version": 1,
        "id": _uuid(rng),
        "task": task,
        "agent": {"name": agent[0], "trainable": agent[1], "config": config},
        "run": dict(run, repetition_index=rng.randrange(8)),
        "nodes": [
            {"message": {"role": "system", "content": system}, "parent": None, "sampled": False},
            {"message": {"role": "user", "content": task["data"]["prompt"]}, "parent": 0, "sampled": False},
        ],
        "calls": [],
        "tools": [_tool_schema(name) for name in _TOOL_NAMES[: 2 if size_hint < 40_000 else 5]],
        "rewards": rewards,
        "metrics": {"num_turns": 0, "num_tool_calls": 0, "completion_tokens": 0, "sandbox_cpu_s": rng.uniform(1, 300)},
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
    ``timing.start`` and call time falls in the hour before ``now`` (default:
    ``time.time()``, read once). No dict or list appears twice in the document,
    so a caller may stamp each trace's ``run`` without touching the others.
    """
    if target_bytes < _MIN_TARGET_BYTES:
        raise ValueError(f"target_bytes must be at least {_MIN_TARGET_BYTES}")
    rng = rng_or_seed if isinstance(rng_or_seed, random.Random) else random.Random(rng_or_seed)
    now = time.time() if now is None else float(now)
    mat = _Material(rng, target_bytes)
    idx = rng.randrange(100_000)
    prompt = mat.text(rng, min(3000, target_bytes // 40), 0.3)
    task = {
        "type": "swe",
        "data": {"prompt": prompt, "idx": idx, "name": f"{rng.choice(_IDENTS)}-{idx}"},
        "key": f"task-{idx}",
        "hash": f"{rng.getrandbits(256):064x}",
    }
    episode = {
        "version": 1,
        "id": _uuid(rng),
        "env": {"id": "swe-gym", "name": "SWE Gym"},
        "task": task,
        "group": {"id": _uuid(rng)},
        "run": {"id": run_id, "type": "train", "name": "bench", "work": {"type": "step", "step": step}},
        "ok": True,
        "errors": [],
        "outcome": "",
        "info": {},
        "traces": [],
    }
    n_traces = 1 if target_bytes < 60_000 else rng.choice((1, 2, 2, 3, 4))
    agents = [_AGENTS[0], *rng.sample(_AGENTS[1:], n_traces - 1)]
    traces = [_trace_skeleton(rng, mat, episode, agent, target_bytes // n_traces) for agent in agents]
    # Provisional times as long as the real ones keep the sizes right; all shift at the end.
    t0 = now - _MAX_SPAN_S - 900
    timing_bytes = 300  # per trace: the timing numbers and metrics, filled in after the turns
    budget = max(0, target_bytes - len(orjson.dumps(dict(episode, traces=traces))) - timing_bytes * n_traces)
    weights = [rng.uniform(0.5, 1.5) for _ in traces]
    clock = t0
    for trace, weight in zip(traces, weights):
        start, boot, setup = clock, rng.uniform(0.5, 8), rng.uniform(0.2, 5)
        share = budget * weight / sum(weights)
        builder = _TraceBuilder(rng, mat, trace, share, start + boot + setup, _MAX_SPAN_S / n_traces)
        builder.fill()
        finalize = rng.uniform(0.1, 2)
        scoring = {"start": builder.clock + finalize, "end": builder.clock + finalize + rng.uniform(0.05, 20)}
        agent_s = builder.clock - (start + boot + setup)
        timing = {"start": start, "boot": boot, "setup": setup, "agent": agent_s, "finalize": finalize}
        trace["timing"] = {key: round(value, 6) for key, value in timing.items()} | {"scoring": scoring}
        calls = trace["calls"]
        trace["metrics"]["num_turns"] = len(calls)
        trace["metrics"]["num_tool_calls"] = sum(len(node["message"].get("tool_calls", ())) for node in trace["nodes"])
        trace["metrics"]["completion_tokens"] = sum(call["usage"]["completion_tokens"] for call in calls)
        clock = scoring["end"] + rng.uniform(0.1, 3)
    span = clock - t0
    shift = now - rng.uniform(span + 1, max(span + 2, 3590)) - t0
    for trace in traces:
        trace["timing"]["start"] = round(trace["timing"]["start"] + shift, 6)
        trace["timing"]["scoring"] = {key: round(value + shift, 6) for key, value in trace["timing"]["scoring"].items()}
        for call in trace["calls"]:
            call["time"] = {key: round(value + shift, 6) for key, value in call["time"].items()}
    reward = sum(r["score"] * r["weight"] for r in traces[0]["rewards"].values() if r)
    completed = traces[0]["stop_condition"] == "completed"
    episode["outcome"] = ("success" if reward >= 1 else "failure") if completed else "truncated"
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
    """Yield ``n`` episodes spread evenly over training steps ``0 .. steps - 1``.

    Episode ``i`` comes from a sub-seed drawn from ``random.Random(seed)`` and
    sits at step ``i * steps // n``; ``now`` is read once for all of them.
    """
    if n < 0 or steps < 1:
        raise ValueError("n must be at least 0 and steps at least 1")
    rng = random.Random(seed)
    now = time.time() if now is None else float(now)
    for i in range(n):
        sub_seed = rng.getrandbits(64)
        yield generate_episode(sub_seed, target_bytes=target_bytes, run_id=run_id, step=i * steps // n, now=now)


def encoded_lines(episodes: Iterable[dict]) -> Iterator[bytes]:
    """Yield each episode as compact orjson followed by ``b"\\n"``: one JSONL line."""
    for episode in episodes:
        yield orjson.dumps(episode) + b"\n"
