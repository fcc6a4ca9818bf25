"""What the ``## Results`` bullets of ``docs/benchmarks.md`` are made with: how figures over
seeds and runs are written (``dev/bench_results.py`` and ``dev/bench_results_wall.py``)."""

from __future__ import annotations

import re
import statistics
import textwrap
from collections.abc import Sequence
from typing import Any

__all__ = [
    "WIDTH",
    "Doc",
    "bullet",
    "fmt_pct",
    "fmt_points",
    "fmt_seeds",
    "fmt_spread",
    "fmt_verdict",
    "fmt_x",
    "one_entry",
]

Doc = dict[str, Any]

#: Width of the generated Markdown lines.
WIDTH = 96


def fmt_spread(values: Sequence[float | None], fmt: str = "{:.2f}") -> str:
    from deploy.bench.common import spread

    return spread(values, fmt)


def fmt_pct(values: Sequence[float | None]) -> str:
    """Fractions per seed as ``mean (min-max) %``."""
    return fmt_spread([None if v is None else 100 * v for v in values], "{:.0f}") + " %"


def fmt_points(values: Sequence[float | None]) -> str:
    """Accuracy differences per seed, in points: ``mean (min to max) point``."""
    got = [100 * v for v in values if v is not None]
    text = f"{statistics.mean(got):+.1f}"
    if len(got) > 1:
        text += f" ({min(got):+.1f} to {max(got):+.1f})"
    return text + " point"


def fmt_x(values: Sequence[float | None], fmt: str = "{:.2f}") -> str:
    """Ratios per seed as ``mean x (min-max)``, the seeds that never got one named."""
    return re.sub(r"^(-?\d+(?:\.\d+)?)", r"\1x", fmt_spread(values, fmt), count=1)


def fmt_seeds(seeds: Sequence[int]) -> str:
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, seeds))


def fmt_verdict(met: bool) -> str:
    from deploy.bench.common import verdict

    return verdict(met)


def one_entry(entries: Sequence[Doc], **match: Any) -> Doc:
    """The entry whose keys have the values ``match`` gives (KeyError when none does)."""
    for e in entries:
        if all(e[k] == v for k, v in match.items()):
            return e
    raise KeyError(f"no entry with {match}")


def bullet(text: str) -> str:
    return textwrap.fill(
        " ".join(text.split()),
        WIDTH,
        initial_indent="- ",
        subsequent_indent="  ",
        break_long_words=False,
        break_on_hyphens=False,
    )
