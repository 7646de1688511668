"""A producer that logs episodes offline until it is killed (crash tests and tools/durability_check.py).

    python tests/_crash_producer.py SEED [--dir ROOT] [--id RUN_ID] [--small]

Prints ``ready``, then, for each write that ``flush()`` confirmed, its ids on
one line. Some records are large (about 1.2 MB; none with ``--small``): a
write then takes several entries and a while. Without ``--dir`` the run goes
to ``./prime-runs``, so the durability check can run it against releases
whose ``init()`` has no ``dir``.
"""

import argparse
import random

from _wire import episode, trace

import prime_runs

parser = argparse.ArgumentParser()
parser.add_argument("seed", type=int)
parser.add_argument("--dir", default=None)
parser.add_argument("--id", default="crashy-run")
parser.add_argument("--small", action="store_true")
args = parser.parse_args()
rng = random.Random(args.seed)
where = {"dir": args.dir} if args.dir else {}
run = prime_runs.init(
    "crashy", mode="offline", id=args.id, handle_signals=False, environments=["e"], model="m", team_id="t", **where
)
blob = "".join(rng.choice("abcdefghij klmnop") for _ in range(600_000))
print("ready", flush=True)
i = 0
while True:
    ids = [f"s{args.seed}-{i + k}" for k in range(rng.randint(1, 4))]
    i += len(ids)
    big = "" if args.small else blob * rng.randint(0, 2)
    run.log_episodes([episode(e, [trace(e + "-t")], info={"blob": big}) for e in ids])
    if run.flush(60):
        print(" ".join(ids), flush=True)
