"""Constants of the launchers: the embedded broker and ``fedstream demo``'s defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Final

# --- Embedded broker (iotcore / rumqttd) -------------------------------------------------
EMBEDDED_MAX_PAYLOAD: Final = 1024 * 1024
# The Python loggers rumqttd's tracing reaches (through iotcore), filed at DEBUG.
EMBEDDED_BROKER_LOGGERS: Final = ("rumqttd", "tracing")
EMBEDDED_MAX_INFLIGHT: Final = 1000
DEFAULT_MQTT_PORT: Final = 1883
# The broker a command talks to unless given --broker (the local one).
DEFAULT_BROKER_URL: Final = f"mqtt://127.0.0.1:{DEFAULT_MQTT_PORT}"

# --- Flower runs ------------------------------------------------------------------------
# How long `fedstream resume` waits for the run that wrote the checkpoint to end: Flower marks
# a run whose ServerApp died failed after two missed heartbeats 30 s apart.
RESUME_WAIT_S: Final = 120.0
RESUME_POLL_S: Final = 2.0

# --- fedstream fleet ---------------------------------------------------------------------
# Its table's width off a terminal (a pipe, a log): wide enough that no header or cell is cut.
FLEET_PLAIN_WIDTH: Final = 240
#: ``fedstream sensors --discovery``: what to look for (deploy.sensor_discovery).
DISCOVERY_MODES: Final = ("all", "homeassistant", "sparkplug", "sample")

# --- fedstream demo ----------------------------------------------------------------------
DEMO_DEVICES: Final = 4
DEMO_MAX_DEVICES: Final = 64  # processes on one machine: a publisher, ingest and SuperNode each
DEMO_CAPACITY: Final = 5000  # samples per device buffer: a demo runs minutes, not days
DEMO_DURATION_S: Final = 20.0  # --stream-only
DEMO_BATCH: Final = 4  # samples per published message
# The demo's training settings over the app's defaults (RunSettings field names; the
# demo's options and --run-config override them).
# No timing probe: on this kind of host a probe is one more Flower exchange (about 25 s,
# measured: 159 s against 134 s for the whole demo) and shortens no round, whose time is
# Flower's orchestration (`--run-config controller-probe=3` turns it on).
# Local work that compute times dominate (the CNN at width 96, 60 steps: about 0.3 s a
# round on a fast device, 4x on the slowest, against the tens of milliseconds other processes
# on the host add), so the table shows slow devices' batches shrinking and compute converging.
DEMO_SETTINGS: Final = {
    "num_rounds": 6,
    "local_steps": 60,
    "model_width": 96,
    "controller_probe": 0,
    # The slowest device's stream (150 samples/s) brings a third of its 60 steps' samples
    # in a 2 s round: it trains each up to three times rather than wait (3 demo runs each:
    # training 63-75 % of the rounds' wall time and no stream wait with 3 passes, 57-59 %
    # with 2, whose device waited for its stream 4-7 % of it; test accuracy 0.91 either way).
    "max_passes": 3,
}
# Forecasting's learning rate (the demo's --task forecast and bench forecast). The task is
# scale-free (L1 loss in units of each window's spread), so one rate fits CO2 in ppm and an
# accelerometer in milli-g. Measured on bench forecast at 10 rounds: 0.001 converged in every
# seed (test MAE 0.386-0.391 ppmv), 0.003 oscillated (ending at 0.412-0.415, past ridge's
# 0.401).
FORECAST_LR: Final = 0.001
# Run-config keys the demo sets for its run (where it writes, which fleet it waits for) ...
DEMO_OWNED: Final = ("out_dir", "checkpoint_dir", "resume", "min_nodes")
# ... and those its publishers and ingest daemons fix (from the synthetic sensor task, or the
# recording given with --source).
DEMO_STREAMED: Final = ("dataset", "sample_shape", "num_classes")
DEMO_SEED: Final = 0  # shuffles a --source recording before it is split across the devices
# The demo exports its final model into this folder of its run folder (unless the run config
# names an export-dir), for `fedstream infer --model` to serve.
DEMO_MODELS: Final = "models"

# --- fedstream simulate -------------------------------------------------------------------
SIMULATE_DEVICES: Final = 10  # virtual devices without a recording's groups to count
SIMULATE_BATCH_PER_DEVICE: Final = 32  # global-batch: this many per device unless given
# ... with a recording: a person's part is a few hundred windows, and a local epoch over it
# at b = 8 is ~40 steps (at 32, ~10: 0.80 held-out accuracy against 0.87, bench people)
SIMULATE_RECORDING_BATCH_PER_DEVICE: Final = 8
SIMULATE_SHOWN_DEVICES: Final = 12  # the live table's rows: the devices scoring worst

# --- fedstream demo: its processes and its run ---------------------------------------------
#: The Flower app fedstream's own runs submit: pyproject.toml is in the checkout's root.
APP_DIR: Final = Path(__file__).resolve().parent.parent
DEMO_INGEST_START_S: Final = 60.0  # until every ingest daemon has subscribed
DEMO_DRAIN_TIMEOUT_S: Final = 30.0  # stream-only: how long the buffers may take to catch up
DEMO_PUBLISH_FOREVER_S: Final = 86_400.0  # training: publishers run until the demo stops them
DEMO_STATUS_POLL_S: Final = 1.0  # how often the progress table reads metrics.jsonl
# How often the run's status is asked for while rounds come in: each `flwr list` is a Python
# process of about 1 CPU-second, which the devices on a 2-core host would otherwise share.
DEMO_STATUS_CHECK_S: Final = 10.0
DEMO_BROKER_OUTAGE_S: Final = 5.0  # --kill-broker: how long the broker stays down

# The in-process runner's model of the aggregator's own work per round (or asynchronous
# aggregation), charged on the virtual clock: lines in the work done, fitted once by
# ``python dev/server_cost.py`` on the 2-core x86_64 development machine (torch 2.13.0+cpu,
# one thread), so that fixed-seed runs stay deterministic. Combining n updates of P values:
# aggregate-s + aggregate-per-value-s x n x P; scoring S held-out samples on a model of P
# parameters: evaluate-s + evaluate-per-sample-parameter-s x S x P.
SERVER_COST: Final = {
    "aggregate_s": 8.8e-6,
    "aggregate_per_value_s": 8.9e-10,
    "evaluate_s": 1.8e-4,
    "evaluate_per_sample_parameter_s": 8.5e-11,
}
