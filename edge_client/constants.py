"""Constants shared by every fedstream component: topics, wire format, defaults.

The aggregator and the deploy tools import these from here so that there is one home for
each number.
"""

from __future__ import annotations

from typing import Final

# --- MQTT topics -------------------------------------------------------------------------
TOPIC_ROOT: Final = "fedstream/v1"
INJECT_TOPIC: Final = f"{TOPIC_ROOT}/inject"
DEVICE_ID_PATTERN: Final = r"[A-Za-z0-9_-]{1,64}"

# --- Sample task (the synthetic sensor windows, and the default device shape) -------------
DEFAULT_SHAPE: Final = (6, 32)  # channels x time steps (accelerometer + gyroscope, 32 ticks)
DEFAULT_NUM_CLASSES: Final = 6
TASK_SEED: Final = 20221217  # fixes the class prototypes: every device learns the same task

# --- Sample frames ---------------------------------------------------------------------
FRAME_MAGIC: Final = b"FSSF"
FRAME_VERSION: Final = 1
FRAME_DTYPE_FLOAT32: Final = 1
FRAME_MAX_NDIM: Final = 4
FRAME_MAX_SAMPLES: Final = 65_536  # per message; bigger declared counts are refused unread
MAX_PAYLOAD_BYTES: Final = 16 * 1024 * 1024
PUBLISHER_ID_MAX_BYTES: Final = 128

# --- Buffer store ----------------------------------------------------------------------
POLICY_TRUNCATION: Final = "truncation"
POLICY_PERSISTENCE: Final = "persistence"
POLICIES: Final = (POLICY_TRUNCATION, POLICY_PERSISTENCE)
DEFAULT_POLICY: Final = POLICY_TRUNCATION
DEFAULT_CAPACITY: Final = 50_000  # samples
SQLITE_BUSY_TIMEOUT_S: Final = 30.0
SQLITE_PAGE_SIZE: Final = 65_536
CHUNK_MAX_SAMPLES: Final = 1024  # samples per stored row (several messages share a row)

# --- Stream rate estimation ------------------------------------------------------------
RATE_TAU_S: Final = 5.0  # EWMA time constant
RATE_MIN_TICK_S: Final = 0.5  # shortest window that updates the EWMA

# --- Ingest daemon ---------------------------------------------------------------------
STATUS_INTERVAL_S: Final = 5.0
INGEST_MAX_BATCH: Final = 8192  # messages per SQLite transaction
INGEST_GATHER_S: Final = 0.01  # how long the writer gathers messages for one transaction
REJECT_LOG_INTERVAL_S: Final = 60.0
RECONNECT_MIN_DELAY_S: Final = 1
RECONNECT_MAX_DELAY_S: Final = 30
KEEPALIVE_S: Final = 30

# --- Publisher -------------------------------------------------------------------------
PUBLISH_MAX_INFLIGHT: Final = 1000
PUBLISH_MAX_OUTSTANDING: Final = 60_000  # paho message ids are 16 bit
# De-duplication remembers out-of-order sequence numbers this far behind the newest:
# more than any publisher can have outstanding.
DEDUP_WINDOW: Final = 65_536
DISTRIBUTIONS: Final = ("constant", "poisson", "bursty")
BURST_FACTOR: Final = 4.0  # bursty: on-phases send at 4x the mean rate, a quarter of the time

# ScaDLES stream-rate sets, samples/s: (distribution, mean, standard deviation).
RATE_SETS: Final = {
    "S1": ("uniform", 38.0, 24.0),
    "S2": ("uniform", 300.0, 112.0),
    "S1p": ("normal", 64.0, 24.0),
    "S2p": ("normal", 256.0, 28.0),
}
MIN_STREAM_RATE: Final = 1.0

# --- Training (values the aggregator and the devices must agree on) ------------------------
WAIT_POLICIES: Final = ("wait", "adapt")
CONTROLLER_MODES: Final = ("fixed", "static", "dynamic")
MODELS: Final = ("cnn", "mlp")

# --- Update codec (edge_client.codec) ---------------------------------------------------
CODEC_MAGIC: Final = b"FSUP"
CODEC_VERSION: Final = 1
CODEC_MODES: Final = ("none", "fp16", "int8", "topk")  # how one frame codes its values
COMPRESS_MODES: Final = (*CODEC_MODES, "adaptive")  # run-config choice; adaptive picks per round
BROADCAST_MODES: Final = ("none", "fp16")  # server -> device model
# Aggregation rules (aggregator.robust): fedavg streams; the others are Byzantine-robust.
AGGREGATIONS: Final = ("fedavg", "trimmed-mean", "median", "krum", "multi-krum")
DEFAULT_TRIM_FRACTION: Final = 0.2
DEFAULT_KRUM_MALICIOUS: Final = 1
CODEC_MAX_RAW_BYTES: Final = 1 << 30  # hard cap on any frame's decompressed size
CODEC_ZSTD_LEVEL: Final = 1
DEFAULT_TOPK_RATIO: Final = 0.1
DEFAULT_ADAPTIVE_DELTA: Final = 0.3
GAP_EWMA_WEIGHT: Final = 0.5  # weight of the newest top-k gap in a device's EWMA

# --- Data injection (ScaDLES) and FedProx ----------------------------------------------
INJECT_POOL_SUFFIX: Final = ".inject.sqlite"  # next to the buffer: injected samples, apart
INJECT_POOL_CAPACITY: Final = 4096  # injected samples a device keeps (truncation: newest)
INJECT_MAX_PAYLOAD_BYTES: Final = 256 * 1024  # larger injection messages are refused
DEFAULT_INJECT_BETA: Final = 0.25  # fraction of its fresh samples a picked device shares
DEFAULT_INJECT_BUDGET: Final = 16_384  # bytes per round, all picked devices together
DEFAULT_INJECT_MIX: Final = 0.25  # planned fraction of each batch drawn from the pool
OUTBOX_PUBLISH_S: Final = 0.5  # how often the ingest daemon publishes queued injections

# --- Flower ------------------------------------------------------------------------------
SUPERLINK_NODE_ID: Final = 1  # Flower's node id of the SuperLink (message source)

# --- Embedded broker (iotcore / rumqttd) -------------------------------------------------
EMBEDDED_MAX_PAYLOAD: Final = 1024 * 1024
EMBEDDED_MAX_INFLIGHT: Final = 1000
DEFAULT_MQTT_PORT: Final = 1883

# --- Datasets a stream can carry (edge_client.datasets) ----------------------------------
DATASETS: Final = ("synthetic", "digits")
DIGITS_SHAPE: Final = (8, 8)  # scikit-learn's 8x8 digit images: 8 rows x 8 columns
DIGITS_CLASSES: Final = 10
DIGITS_HELD_OUT: Final = 400  # images kept for evaluation, never streamed
