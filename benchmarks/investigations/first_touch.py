"""What a page touched for the first time costs: system CPU seconds per GiB of freshly allocated memory filled once.

Each round allocates ``--gib`` GiB in 256 MiB float32 tensors, fills them (every page faults in) and frees them
(the process ends). On a virtual machine a guest page never used since boot also has to be backed by the host:
the first round's price is then higher than a later round's, which reuses pages the guest kernel has freed.
A long run whose memory grows (a batched probe's caches) pays that price in system time, which the benchmarks'
CPU seconds count. Each round runs in a fresh interpreter:

    .venv/bin/python benchmarks/investigations/first_touch.py --gib 6 --rounds 3
"""

from __future__ import annotations

import argparse
import subprocess
import sys

ROUND = """
import resource, torch
torch.set_num_threads(1)
before = resource.getrusage(resource.RUSAGE_SELF)
held = []
for _ in range({chunks}):
    chunk = torch.empty(256 << 18)
    chunk.fill_(1.0)
    held.append(chunk)
after = resource.getrusage(resource.RUSAGE_SELF)
print(after.ru_minflt - before.ru_minflt, after.ru_stime - before.ru_stime, after.ru_utime - before.ru_utime)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=6.0, help="memory filled per round (GiB)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    chunks = max(1, round(args.gib * 4))
    gib = chunks / 4
    print(f"{gib:g} GiB filled per round, in 256 MiB tensors, each round a fresh process")
    print("round   minor faults   system s/GiB   user s/GiB")
    for index in range(args.rounds):
        out = subprocess.run([sys.executable, "-c", ROUND.format(chunks=chunks)], capture_output=True, text=True)
        if out.returncode:
            print(out.stderr, file=sys.stderr)
            return out.returncode
        faults, system, user = out.stdout.split()
        print(f"{index + 1:5d}   {int(faults):12d}   {float(system) / gib:12.2f}   {float(user) / gib:10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
