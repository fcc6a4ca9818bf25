"""Write a recording to try the app with: one file per watch, and a test file.

    python -m activity_app.record data/ [--watches 2] [--windows 3000] [--seed 0]

Windows of 3 axes x 50 readings (1 s at 50 Hz) of 4 activities (still, walk, run, cycle):
gravity on one axis, a periodic component whose frequency and strength depend on the
activity, and noise. Each watch has its own gain and offset per axis (what the task's
per-device standardisation removes). Stand-in for a real recording: with your own, write
``x`` (windows, axes, steps) and ``y`` (labels) to an .npz the same way.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

ACTIVITIES = ("still", "walk", "run", "cycle")
AXES, STEPS, RATE_HZ = 3, 50, 50.0
# per activity: step frequency (Hz), amplitude per axis
FREQ = np.array([0.0, 1.8, 2.8, 1.2])
AMP = np.array([[0.0, 0.0, 0.0], [0.6, 0.3, 0.8], [1.4, 0.8, 1.6], [0.3, 0.9, 0.4]])


def windows(
    n: int, rng: np.random.Generator, gain: np.ndarray, offset: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` labelled windows as one watch records them."""
    y = rng.integers(0, len(ACTIVITIES), n)
    t = np.arange(STEPS) / RATE_HZ
    phase = rng.uniform(0, 2 * np.pi, (n, 1, 1))
    freq = FREQ[y][:, None, None] * rng.uniform(0.9, 1.1, (n, 1, 1))
    x = AMP[y][:, :, None] * np.sin(2 * np.pi * freq * t + phase)
    x[:, 2, :] += 1.0  # gravity
    x += rng.normal(0, 0.35, x.shape)
    return (x * gain[:, None] + offset[:, None]).astype(np.float32), y.astype(np.int64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--watches", type=int, default=2)
    parser.add_argument("--windows", type=int, default=3000, help="per watch")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    tests = []
    for i in range(args.watches):
        gain, offset = rng.uniform(0.6, 1.6, AXES), rng.uniform(-0.5, 0.5, AXES)
        x, y = windows(args.windows + 250, rng, gain, offset)
        np.savez(args.out / f"watch-{i}.npz", x=x[250:], y=y[250:])
        tests.append((x[:250], y[:250]))
    x_test = np.concatenate([x for x, _ in tests])
    y_test = np.concatenate([y for _, y in tests])
    np.savez(args.out / "test.npz", x=x_test, y=y_test)
    print(f"wrote {args.watches} watches x {args.windows} windows and test.npz to {args.out}")


if __name__ == "__main__":
    main()
