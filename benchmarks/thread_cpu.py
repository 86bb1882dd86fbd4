"""Which threads of a process (and of the processes it starts) use CPU, over time.

    python benchmarks/thread_cpu.py -- python examples/launch_bound.py --steps 2500
    python benchmarks/thread_cpu.py --after 12 -- python -m diagnose watch -q examples/launch_bound.py

Runs the command, reads every thread's user and system time from ``/proc`` five times a second
(the command's process and all its descendants: ``diagnose watch`` forks its child), and prints,
per thread (process, thread id, name), its CPU time in 2-second buckets and its share of one
core after ``--after`` seconds (past start-up and the main window). Linux only. docs/watch.md
("The fourteenth session") used it to ask whether a thread left behind by the profiler, or
watch's sampler, is what slows a host-bound step after the main window (neither was).
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import descendants, proc_stat

BUCKET_S = 2


def thread_cpu(pids: list[int]) -> dict[tuple[int, int, str], float]:
    """(process, thread, name) -> the thread's CPU seconds so far (user + system)."""
    seen: dict[tuple[int, int, str], float] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                name, cpu = proc_stat(f"/proc/{pid}/task/{tid}/stat")
            except (OSError, ValueError):
                continue
            seen[(pid, int(tid), name)] = cpu
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--after", type=float, default=12.0, help="seconds after which each thread's share is taken")
    parser.add_argument("--every", type=float, default=0.2, help="seconds between reads")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command (write it after --)")
    start = time.perf_counter()
    proc = subprocess.Popen(command)
    reads: list[tuple[float, dict[tuple[int, int, str], float]]] = []
    while proc.poll() is None:
        reads.append((time.perf_counter() - start, thread_cpu(descendants(proc.pid))))
        time.sleep(args.every)
    print(f"exit {proc.returncode}, {time.perf_counter() - start:.1f} s")
    last: dict[tuple[int, int, str], float] = {}
    buckets: dict[tuple[int, int, str], dict[int, float]] = collections.defaultdict(
        lambda: collections.defaultdict(float)
    )
    for t, seen in reads:
        for key, cpu in seen.items():
            if key in last:
                buckets[key][int(t // BUCKET_S) * BUCKET_S] += cpu - last[key]
            last[key] = cpu
    end = reads[-1][0] if reads else 0.0
    span = max(end - args.after, 1e-9)
    for key in sorted(buckets, key=lambda k: -sum(buckets[k].values())):
        total = sum(buckets[key].values())
        if total < 0.02:
            continue
        late = sum(v for b, v in buckets[key].items() if b >= args.after)
        row = " ".join(f"{int(buckets[key].get(b, 0) * 1000):5d}" for b in range(0, int(end) + 1, BUCKET_S))
        print(
            f"{key[0]:>7} {key[1]:>7} {key[2][:16]:<16} {total:6.2f} s, after {args.after:.0f} s "
            f"{late / span:6.1%} of a core | ms per {BUCKET_S} s: {row}"
        )


if __name__ == "__main__":
    main()
