"""What every side of fedstream must agree on: topics, frame and codec formats, record
versions, and the vocabularies of the run config.

The device runtime, the stream emulation, the aggregator and the deploy tools import these
from here, so that each value has one home.
"""

from __future__ import annotations

import re
from typing import Final

# --- MQTT topics -------------------------------------------------------------------------
TOPIC_ROOT: Final = "fedstream/v1"
INJECT_TOPIC: Final = f"{TOPIC_ROOT}/inject"
DEVICE_ID_PATTERN: Final = r"[A-Za-z0-9_-]{1,64}"
# Cloud brokers' limits every fedstream topic and client id keeps within: AWS IoT Core
# refuses topics with more than 7 '/' and client ids over 128 bytes.
TOPIC_MAX_SLASHES: Final = 7
CLIENT_ID_MAX_BYTES: Final = 128
# A client id is the device id, this separator (never in a device id, so that no device's
# ids can be another's) and the process's role: `pi-1.ingest`, `pi-1.publish.<id>`.
CLIENT_ID_SEPARATOR: Final = "."
CLIENT_ROLES: Final = ("ingest", "infer", "publish", "agent")
# The largest message a fedstream sender publishes unless told otherwise (--max-payload);
# bigger frames go as several. AWS IoT Core's limit (128 KB), the smallest of the common
# brokers (Azure IoT Hub 256 KB, Azure Event Grid 512 KB, EMQX 1 MB, Mosquitto 256 MB).
DEFAULT_MAX_PAYLOAD_BYTES: Final = 128_000

# --- Sample frames (edge_client.wire.frames) ---------------------------------------------
FRAME_MAGIC: Final = b"FSSF"
FRAME_VERSION: Final = 1
FRAME_DTYPE_FLOAT32: Final = 1
FRAME_MAX_NDIM: Final = 4
FRAME_MAX_SAMPLES: Final = 65_536  # per message; bigger declared counts are refused unread
MAX_PAYLOAD_BYTES: Final = 16 * 1024 * 1024
PUBLISHER_ID_MAX_BYTES: Final = 128
INJECT_MAX_PAYLOAD_BYTES: Final = 256 * 1024  # larger injection messages are refused

# --- Per-reading JSON (edge_client.wire.readings) ----------------------------------------
TIME_UNITS: Final = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}  # seconds per unit
#: Per-reading payloads: JSON objects, one bare value a message (ESPHome, statestream), or
#: Sparkplug B (edge_client.wire.sparkplug).
PAYLOADS: Final = ("json", "plain", "sparkplug")
MAX_PLAIN_BYTES: Final = 64  # one number's text; a longer bare payload is refused
#: Values that say a sensor has none (Home Assistant's, Zigbee2MQTT's null), lower case.
MISSING_VALUES: Final = frozenset({"", "unavailable", "unknown", "none", "null", "n/a"})
NO_LABEL: Final = -1  # the label of a sample cut from a label-free stream

# --- Sparkplug B (edge_client.wire.sparkplug) ----------------------------------------------
SPARKPLUG_NAMESPACE: Final = "spBv1.0"
#: The longest group, edge node or device id taken (a longer topic level is refused).
MAX_SPARKPLUG_ID: Final = 256
#: More metrics in one payload are refused (a birth of a large PLC holds a few thousand).
MAX_SPARKPLUG_METRICS: Final = 10_000
#: Data messages held for aliases no birth has named yet; past it the oldest is dropped.
SPARKPLUG_HELD_MAX: Final = 256
SPARKPLUG_HELD_BYTES: Final = 1024 * 1024  # ... and at most this many bytes of them
#: The node control metric whose NCMD asks an edge node to publish its births again.
SPARKPLUG_REBIRTH_METRIC: Final = "Node Control/Rebirth"
SPARKPLUG_REBIRTH_S: Final = 30.0  # at most one rebirth request per this many seconds

# --- Update codec (edge_client.wire.codec) -----------------------------------------------
CODEC_MAGIC: Final = b"FSUP"
CODEC_VERSION: Final = 1
CODEC_MODES: Final = ("none", "fp16", "int8", "topk")  # how one frame codes its values
CODEC_MAX_RAW_BYTES: Final = 1 << 30  # hard cap on any frame's decompressed size
CODEC_ZSTD_LEVEL: Final = 1
DEFAULT_TOPK_RATIO: Final = 0.1
GAP_EWMA_WEIGHT: Final = 0.5  # weight of the newest top-k gap in a device's EWMA

# --- Round records (edge_client.wire.records) ---------------------------------------------
# The layout version of the plan and reply records. It goes up only when a reader of the
# old layout would misread the new one; adding an optional key keeps it. 2: the model travels
# packed (RoundPlan.model_layout), which a reader of version 1 cannot load: it refuses the
# plan as newer-format, saying to upgrade, instead of failing on the arrays.
RECORD_VERSION: Final = 2
# A device reports its training diverged (the reply's train-diverged) when its training loss
# is not finite or above this many times the first loss it measured in the run; it then
# sends no update, and the aggregator counts the round as diverged (max-diverged-rounds).
DIVERGED_LOSS_RATIO: Final = 1000.0

# --- Run-config vocabularies (edge_client.wire.run_config) --------------------------------
WAIT_POLICIES: Final = ("wait", "adapt")  # how a device waits for its plan's samples
CONTROLLER_MODES: Final = ("fixed", "static", "dynamic")  # aggregator.controller
ADAPTIVE: Final = "adaptive"  # the compress choice that lets the aggregator pick per round
COMPRESS_MODES: Final = (*CODEC_MODES, ADAPTIVE)
BROADCAST_MODES: Final = ("none", "fp16")  # how the model is sent down
# Aggregation rules (aggregator.aggregation): adaptive, fedavg and fednova stream; the others
# are Byzantine-robust and keep every update of the round.
ROBUST_AGGREGATIONS: Final = ("trimmed-mean", "median", "krum", "multi-krum")
AGGREGATIONS: Final = ("adaptive", "fedavg", "fednova", *ROBUST_AGGREGATIONS)
#: The rules that weigh every device the same under differential privacy and secure
#: aggregation (adaptive's weights come from the updates the aggregator must not see apart).
EQUAL_WEIGHT_AGGREGATIONS: Final = ("adaptive", "fednova")
#: How the simulation engine's virtual devices keep their streams: as counts, samples made
#: only when a round takes them (lazy), or stored in a buffer file each (files).
SIM_BUFFERS: Final = ("lazy", "files")
DRIFT_REACTIONS: Final = ("none", "learning-rate", "boost")  # the aggregator's reactions to drift
# How the aggregator drives training (aggregator.server_app): rounds that wait for every
# device, or FedBuff's buffered asynchronous aggregation (aggregator.asynchronous).
MODES: Final = ("sync", "async")
STALENESS_RULES: Final = ("constant", "polynomial", "hinge")  # aggregator.fedbuff
#: Differential privacy (aggregator.privacy): none, DP-FedAvg with the aggregator's noise
#: (central), or noise added on each device before it sends (local).
DP_MODES: Final = ("off", "central", "local")
#: Secure aggregation: what a device multiplies its update by before masking it (fednova,
#: fedavg, differential privacy's equal weights).
SECAGG_WEIGHTINGS: Final = ("steps", "samples", "equal")

# What is learned (edge_client.task): the names a run config takes for its task, model,
# preprocessing and emulated streams, and the built-in datasets' shapes it checks against.
MODELS: Final = ("cnn", "cnn-bn", "mlp")  # built-in models (a user names theirs by import path)
#: What stays on each device (edge_client.task.personal): nothing, the output layer
#: (FedPer/FedRep), or the normalisation layers (FedBN).
PERSONALIZE: Final = ("none", "head", "bn")
BUILTIN_TASKS: Final = ("classification", "forecast")  # a user names theirs by import path
#: A user's task or model in the run config: ``package.module:Name`` (``module:Outer.Inner``).
IMPORT_PATH: Final = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
PREPROCESSING: Final = ("none", "standardize")  # the built-in task's preprocessing
DATASETS: Final = ("synthetic", "digits")  # what an emulated stream can carry
DEFAULT_NUM_CLASSES: Final = 6  # the synthetic sensor task's classes
DIGITS_SHAPE: Final = (8, 8)  # scikit-learn's digits: 8x8 images, 8 rows x 8 columns
DIGITS_CLASSES: Final = 10

# ScaDLES stream-rate sets, samples/s: (distribution, mean, standard deviation).
RATE_SETS: Final = {
    "S1": ("uniform", 38.0, 24.0),
    "S2": ("uniform", 300.0, 112.0),
    "S1p": ("normal", 64.0, 24.0),
    "S2p": ("normal", 256.0, 28.0),
}
# OmniLearn's heterogeneity levels: CPU cores per device (a device's slowdown is the most
# cores over its own).
OMNILEARN_LEVELS: Final[dict[str, tuple[int, ...]]] = {
    "HL1": (12, 12, 12, 12),
    "HL2": (12, 12, 8, 16),
    "HL4": (9, 9, 6, 24),
    "HL8": (6, 6, 4, 32),
}
