"""How many cores are idle now, read from ``/proc/stat`` over one second (``dev/test.sh``
sizes its process-tier workers by it).

    python dev/idle_cores.py [--most N]    # prints a whole number, at least 1

Where ``/proc/stat`` is missing (not Linux), every core counts as idle.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

STAT = Path("/proc/stat")
#: Seconds the busy and idle times are read over.
WINDOW_S = 1.0


def _idle_and_total() -> tuple[int, int]:
    """The machine's idle (idle + iowait) and total jiffies so far."""
    fields = [int(v) for v in STAT.read_text().splitlines()[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)


def idle_cores(window_s: float = WINDOW_S) -> float:
    """Cores' worth of idle time over the next ``window_s`` seconds."""
    cores = os.cpu_count() or 1
    if not STAT.exists():
        return float(cores)
    idle0, total0 = _idle_and_total()
    time.sleep(window_s)
    idle1, total1 = _idle_and_total()
    return cores * (idle1 - idle0) / max(1, total1 - total0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--most", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    print(max(1, min(args.most, round(idle_cores()))))


if __name__ == "__main__":
    main()
