"""Device populations of the simulation engine: each virtual device's speed, stream rate and
availability, drawn from named distributions or read from a trace file.

The run config's ``sim-population`` holds space-separated terms (any may be left out; what
is left out comes from ``sim-slowdowns`` and ``sim-rates``, cycled over the devices):

- ``slowdown=DIST``: how many times slower than this machine a device trains;
  ``const(X)``, ``uniform(A,B)``, ``lognormal(MU,SIGMA)``, ``choice(X,Y,...)``, or
  ``omnilearn(HL1|HL2|HL4|HL8)`` (OmniLearn's heterogeneity levels: core counts 12/12/12/12,
  12/12/8/16, 9/9/6/24, 6/6/4/32, slowdown = most cores / cores, cycled over the devices).
  Draws below 1 count as 1.
- ``rate=DIST``: samples per second; ``const``, ``uniform``, ``normal(MEAN,SD)``, ``choice``
  or ``scadles(S1|S2|S1p|S2p)`` (ScaDLES' rate sets). Draws below 1/s count as 1/s.
- ``availability=always`` (the default) or ``availability=churn(ON_S,OFF_S)``: online and
  offline spells of exponential lengths with means ``ON_S`` and ``OFF_S`` seconds, the
  first state drawn with the stationary odds.
- ``trace=PATH``: a CSV file with the header ``device,slowdown,rate,offline``, one row per
  device (``device``: the partition id or ``sim-<id>``); ``offline`` lists offline
  intervals in seconds since the device's first round, ``START-END`` separated by ``;``.
  An empty field, or a device the file does not list, falls back to the terms above.

Each device's draws are seeded by the run's ``seed`` and its id: the same run config gives
the same fleet.
"""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edge_client.emulation.constants import MIN_STREAM_RATE
from edge_client.emulation.schedule import draw_rate
from edge_client.runtime.seeding import device_rng
from edge_client.wire.constants import OMNILEARN_LEVELS
from edge_client.wire.population import PopulationSpec, finite_number, positive_number

__all__ = ["DeviceProfile", "profile_of"]

_STREAM = 3_000_000  # seed streams of the population's draws: + 0 slowdown, 1 rate, 2 churn


@dataclass(frozen=True)
class DeviceProfile:
    """One virtual device: its slowdown, its stream rate, when it is away.

    Attributes
    ----------
    slowdown : float
        Training runs this many times slower (>= 1).
    rate : float
        Samples per second of its stream.
    offline : tuple of (float, float)
        Intervals ``[start, end)``, seconds since its first round, when it is away (a trace).
    churn : tuple of (float, float) or None
        Mean online and offline spells (s), for availability drawn as it goes.
    churn_seed : tuple of int
        Seeds the spells (the run's seed, the device).
    """

    slowdown: float = 1.0
    rate: float = 400.0
    offline: tuple[tuple[float, float], ...] = ()
    churn: tuple[float, float] | None = None
    churn_seed: tuple[int, str] = (0, "")

    def online(self, t: float) -> bool:
        """Whether the device is there ``t`` seconds after its first round."""
        if any(a <= t < b for a, b in self.offline):
            return False
        if self.churn is None:
            return True
        on, off = self.churn
        rng = device_rng(self.churn_seed[0], self.churn_seed[1], _STREAM + 2)
        up = bool(rng.random() < on / (on + off))
        clock = 0.0
        while True:  # spells until t: a few per hour at realistic means
            clock += float(rng.exponential(on if up else off))
            if t < clock:
                return up
            up = not up


def profile_of(
    spec: PopulationSpec,
    index: int,
    seed: int,
    slowdowns: Sequence[float] = (1.0,),
    rates: Sequence[float] = (400.0,),
) -> DeviceProfile:
    """Device ``index``'s profile (``sim-<index>``) in the population ``spec``.

    Parameters
    ----------
    spec : PopulationSpec
        The run's ``sim-population``, parsed.
    index : int
        The device's partition id.
    seed : int
        The run's seed.
    slowdowns, rates
        What the population leaves out, cycled over the devices (``sim-slowdowns``,
        ``sim-rates``).

    Raises
    ------
    ValueError
        If the trace file cannot be read or has a bad row.
    """
    device = f"sim-{index}"
    slowdown = slowdowns[index % len(slowdowns)]
    if spec.slowdown is not None:
        slowdown = _draw(*spec.slowdown, device_rng(seed, device, _STREAM), index)
    rate = rates[index % len(rates)]
    if spec.rate is not None:
        rate = _draw(*spec.rate, device_rng(seed, device, _STREAM + 1), index)
    offline: tuple[tuple[float, float], ...] = ()
    row = _trace(spec.trace).get(index, {}) if spec.trace else {}
    if row.get("slowdown"):
        slowdown = float(row["slowdown"])
    if row.get("rate"):
        rate = float(row["rate"])
    if row.get("offline"):
        offline = _intervals(row["offline"], f"{spec.trace}: device {index}")
    return DeviceProfile(
        slowdown=max(1.0, slowdown),
        rate=max(MIN_STREAM_RATE, rate),
        offline=offline,
        churn=spec.churn,
        churn_seed=(seed, device),
    )


@functools.lru_cache(maxsize=4)
def _trace(path: str) -> dict[int, dict[str, str]]:
    """A trace file's rows by device index (read once per process)."""
    rows: dict[int, dict[str, str]] = {}
    try:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            missing = {"device", "slowdown", "rate", "offline"} - set(reader.fieldnames or ())
            if missing:
                raise ValueError(
                    f"{path}: the header needs device,slowdown,rate,offline "
                    f"(missing {', '.join(sorted(missing))})"
                )
            for line, row in enumerate(reader, 2):
                rows[_device_index(row["device"], f"{path}:{line}")] = row
                for key in ("slowdown", "rate"):
                    if row[key]:
                        positive_number(row[key], f"{path}:{line}: {key}")
    except OSError as err:
        raise ValueError(f"cannot read the population trace {path}: {err}") from err
    return rows


def _draw(name: str, args: tuple[str, ...], rng: np.random.Generator, index: int) -> float:
    if name == "omnilearn":
        cores = OMNILEARN_LEVELS[args[0]]
        return max(cores) / cores[index % len(cores)]
    if name == "scadles":
        return draw_rate(args[0], rng)
    x = [float(a) for a in args]
    if name == "const":
        return x[0]
    if name == "uniform":
        return float(rng.uniform(x[0], x[1]))
    if name == "lognormal":
        return float(rng.lognormal(x[0], x[1]))
    if name == "normal":
        return float(rng.normal(x[0], x[1]))
    return float(rng.choice(x))  # choice


def _device_index(text: str, where: str) -> int:
    match = re.fullmatch(r"(?:sim-)?(\d+)", text.strip())
    if match is None:
        raise ValueError(f"{where}: device {text!r} is not a partition id or sim-<id>")
    return int(match.group(1))


def _intervals(text: str, where: str) -> tuple[tuple[float, float], ...]:
    out = []
    for part in text.split(";"):
        start, sep, end = part.strip().partition("-")
        if not sep:
            raise ValueError(f"{where}: offline interval {part!r} is not START-END")
        a, b = finite_number(start, where), finite_number(end, where)
        if not 0 <= a < b:
            raise ValueError(f"{where}: offline interval {part!r} needs 0 <= START < END")
        out.append((a, b))
    return tuple(out)
