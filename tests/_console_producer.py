"""A training script with no logging set up, for the console tests: logs, then finishes.

    python tests/_console_producer.py SERVICE_URL ROOT [--finish-timeout S] [--ready]

Logs 19 good episodes in one call, then a call of two whose item 1 holds a NaN; with
``--ready`` prints ``ready`` and waits for a line on stdin before finishing.
Prints the run id last.
"""

import argparse
import sys

from _wire import episode, trace

import prime_runs

parser = argparse.ArgumentParser()
parser.add_argument("url")
parser.add_argument("root")
parser.add_argument("--finish-timeout", type=float, default=60.0)
parser.add_argument("--ready", action="store_true")
args = parser.parse_args()
run = prime_runs.init(
    "console-producer",
    environments=["e"],
    model="m",
    team_id="t",
    api_key="test-key",
    base_url=args.url,
    dir=args.root,
    finish_timeout_s=args.finish_timeout,
)
run.log_episodes([episode(f"p-{i}", [trace(f"p-{i}-t")]) for i in range(19)])
run.log_episodes(
    [episode("p-19", [trace("p-19-t")]), episode("p-bad", [trace("p-bad-t", info={"score": float("nan")})])]
)
if args.ready:
    print("ready", flush=True)
    sys.stdin.readline()
run.finish()
print(run.id, flush=True)
