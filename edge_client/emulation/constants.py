"""Constants of the stream emulation: publishers, arrival processes (ScaDLES' rate sets and
OmniLearn's heterogeneity levels are in :mod:`edge_client.wire.constants`: run configs name
them)."""

from __future__ import annotations

from typing import Final

PUBLISH_MAX_INFLIGHT: Final = 1000
PUBLISH_MAX_OUTSTANDING: Final = 60_000  # paho message ids are 16 bit
PUBLISH_PROGRESS_S: Final = 10.0  # fedstream publish prints a progress line this often
# A publisher whose broker sets no connect timeout gives up after this many seconds.
PUBLISH_CONNECT_TIMEOUT_S: Final = 30.0
# After a stop signal, a publisher waits at most this long for the broker's acknowledgements
# of what it sent (none while the broker is away): it exits within seconds either way.
PUBLISH_STOP_DRAIN_S: Final = 3.0
DISTRIBUTIONS: Final = ("constant", "poisson", "bursty")
BURST_FACTOR: Final = 4.0  # bursty: on-phases send at 4x the mean rate, a quarter of the time

MIN_STREAM_RATE: Final = 1.0
# A replayed series starts again this much later in stream time: above the ingest daemon's
# --max-gap (default 1 s), so that no window spans the seam between its end and its start.
# Each pass puts the stamps this much further ahead of the clock (ingest refuses readings
# stamped more than a day ahead: about 17,000 passes).
REPLAY_GAP_S: Final = 5.0

# --- A synthetic accelerometer (edge_client.emulation.accelerometer) -------------------------
ACCEL_HZ: Final = 64.0  # readings per second
ACCEL_CHANNELS: Final = ("ax", "ay", "az")
ACCEL_GRAVITY: Final = 1000.0  # milli-g counts, mostly on az

#: A virtual device's SGD step on the simulation engine's virtual clock: a fixed cost plus one
#: per sample, times its slowdown (the default CNN on 6 x 32 windows, one core of the
#: development machine: 0.8 ms at b = 8, 1.2 ms at 32, 2.8 ms at 128). Reported instead of
#: the wall time Ray's actor took, so the controller's plans, and a seeded run, repeat.
SIM_STEP_FIXED_S: Final = 0.0006
SIM_STEP_PER_SAMPLE_S: Final = 0.000024

# --- Data injection without a broker (edge_client.emulation.shared_topic) --------------------
SHARED_TOPIC_DIR: Final = "inject"  # under the run's directory of virtual devices
