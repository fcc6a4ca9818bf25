"""Constants of the device runtime: the buffer store, rate estimation, the ingest daemon."""

from __future__ import annotations

import signal
from typing import Final

# --- Buffer store ----------------------------------------------------------------------
POLICY_TRUNCATION: Final = "truncation"
POLICY_PERSISTENCE: Final = "persistence"
POLICIES: Final = (POLICY_TRUNCATION, POLICY_PERSISTENCE)
DEFAULT_POLICY: Final = POLICY_TRUNCATION
DEFAULT_CAPACITY: Final = 50_000  # samples
SQLITE_BUSY_TIMEOUT_S: Final = 30.0
SQLITE_PAGE_SIZE: Final = 65_536
CHUNK_MAX_SAMPLES: Final = 1024  # samples per stored row (several messages share a row)
# The buffer file's layout (SQLite user_version); files of older layouts migrate on open.
SCHEMA_VERSION: Final = 4
# De-duplication remembers out-of-order sequence numbers this far behind the newest:
# more than any publisher can have outstanding (MQTT message ids are 16 bit).
DEDUP_WINDOW: Final = 65_536

# --- Stream rate estimation ------------------------------------------------------------
RATE_TAU_S: Final = 5.0  # EWMA time constant
RATE_MIN_TICK_S: Final = 0.5  # shortest window that updates the EWMA

# --- Ingest daemon ---------------------------------------------------------------------
STATUS_INTERVAL_S: Final = 5.0
#: How long a stopping ingest daemon waits for its last status to be acknowledged and its
#: DISCONNECT to go out (a dropped connection would make the broker publish the will).
STOP_FLUSH_S: Final = 5.0
#: Longest the writer waits, after committing per-reading JSON, for paho to write that
#: commit's acknowledgements before it gathers the next transaction (see _flush_acks).
ACK_FLUSH_MAX_S: Final = 1.0
# Messages per SQLite transaction: a fraction of the broker's in-flight window (1,000 in
# broker_config/), so that it keeps sending while one commits ...
INGEST_MAX_BATCH: Final = 256
# ... and payload bytes: beyond a few MB a transaction only grows the WAL (64-sample messages
# of 784-byte windows drained 27 % slower in 50 MB transactions than in 2 MB ones).
INGEST_MAX_BYTES: Final = 4 << 20
# A transaction gathers messages for up to the commit interval, and ends early once none has
# come for IDLE_GAPS of the stream's mean gaps between messages, and at least INGEST_GATHER_S
# (the stream paused, or the broker's in-flight window is full: its unacknowledged messages
# wait for this commit). Each commit rewrites whole SQLite pages, so fewer, larger commits
# write far less per sample (`fedstream bench deployment` measures it).
INGEST_GATHER_S: Final = 0.01
IDLE_GAPS: Final = 8
COMMIT_INTERVAL_S: Final = 0.5
MAX_COMMIT_INTERVAL_S: Final = 60.0  # the longest --commit-interval
REJECT_LOG_INTERVAL_S: Final = 60.0
RATE_LOG_S: Final = 60.0  # the ingest daemon logs what came in this often
# The longest the daemon holds payloads it received but has not committed: past this many
# bytes its network thread waits for the writer's next commit, so the broker keeps the rest
# as messages in flight (TCP pushes back) instead of this process growing without bound.
INGEST_MAX_UNCOMMITTED_BYTES: Final = 64 << 20
# Reader first: while more than about this many messages wait unread in the daemon's socket
# (its unread bytes over the mean message's), its writer waits (READER_YIELD_S at a time,
# READER_YIELD_MAX_S per batch at most) so that paho's thread can read them. A broker drops
# what it cannot write to a slow reader: Mosquitto (2.0.16 on, and Debian's 2.0.11) any packet
# past max_queued_messages (1000) waiting unwritten, QoS 1 in flight included. Counted in
# messages, it is small ones (a reading each) that need it: reading them costs the interpreter
# per message; large frames are bound by the writer, whom waiting would only slow.
READER_BACKLOG_MESSAGES: Final = 500
READER_YIELD_S: Final = 0.002
READER_YIELD_MAX_S: Final = 0.2
# How long the broker keeps the ingest daemon's session (its subscriptions and the messages
# that arrive meanwhile) after the daemon goes away: MQTT 5's session expiry interval.
INGEST_SESSION_EXPIRY_S: Final = 7 * 86_400
# A loss warning (messages or readings that never arrived) at most this often, with the
# count since the last one.
LOSS_LOG_INTERVAL_S: Final = 60.0
RECONNECT_MIN_DELAY_S: Final = 1
RECONNECT_MAX_DELAY_S: Final = 30
KEEPALIVE_S: Final = 30
PAHO_LOGGER: Final = "paho.mqtt.client"  # the Python logger paho's own log goes to

# --- MQTT sessions (edge_client.runtime.mqtt) ----------------------------------------------
MQTT_5: Final = "5"
MQTT_311: Final = "3.1.1"
MQTT_VERSIONS: Final = (MQTT_5, MQTT_311)
DEFAULT_MQTT_VERSION: Final = MQTT_5
# Every fedstream client on a host speaks this version unless told otherwise (--mqtt-version).
MQTT_VERSION_ENV: Final = "FEDSTREAM_MQTT_VERSION"
# The most messages MQTT 5 lets a client say it takes unacknowledged (Receive Maximum): the
# ingest daemon asks for all of them, so that a burst waits in flight to it, not in the
# broker's bounded queue (memory: INGEST_MAX_UNCOMMITTED_BYTES).
RECEIVE_MAXIMUM: Final = 65_535
# Topic filters per SUBSCRIBE packet: AWS IoT Core takes at most 8.
SUBSCRIBE_MAX_FILTERS: Final = 8

# --- Windowing per-reading streams (edge_client.runtime.windowing) ---------------------------
DEFAULT_MAX_GAP_S: Final = 1.0  # no window spans a longer silence between readings
DEFAULT_MAX_SKEW_S: Final = 2.0  # how far one topic may run behind another
DEFAULT_LABEL_WAIT_S: Final = 30.0  # stream seconds a window waits for its label
NO_TIME_FIELD: Final = "none"  # --time-field none: readings stamped on arrival
#: Arrival stamps of one topic rise by at least this (s): a burst's readings stay apart.
ARRIVAL_STEP_S: Final = 1e-6
RECENT_TIMESTAMPS: Final = 64  # per topic: a redelivered reading is known by its timestamp
LABEL_EVENTS_MAX: Final = 4096  # labels kept ahead of the data (each commit saves them)
MAX_AHEAD_S: Final = 86_400.0  # a reading stamped further ahead of the host clock is refused
WINDOWING_META: Final = "windowing"  # the buffer's meta key holding the windowing state

# --- Data injection (ScaDLES), device side --------------------------------------------------
INJECT_POOL_SUFFIX: Final = ".inject.sqlite"  # next to the buffer: injected samples, apart
INJECT_POOL_CAPACITY: Final = 4096  # injected samples a device keeps (truncation: newest)
OUTBOX_PUBLISH_S: Final = 0.5  # how often the ingest daemon publishes queued injections

# --- Device state keys shared by writers and readers -----------------------------------------
DRIFT_STATUS_KEY: Final = "drift-status"  # JSON: the drift watcher's DriftStatus
DRIFT_WATCH_KEY: Final = "drift-watch"  # the watcher itself (ADWIN's buckets), pickled

# --- Inference (fedstream infer) --------------------------------------------------------------
MODEL_POLL_S: Final = 2.0  # how often the daemon looks for a newer model version
INFER_BATCH_MAX: Final = 512  # samples predicted in one call at most
INFER_STATUS_S: Final = 10.0  # seconds between the daemon's log lines of its counters

# What the ingest daemon logs once the broker acknowledged its subscriptions: from then on the
# broker holds its session, so a launcher may start publishers (deploy.demo_streams waits for it).
INGEST_SUBSCRIBED_LOG: Final = "subscribed to"

# The device agent (edge_client.runtime.agent) and its channel to the ClientApp.
AGENT_PROTOCOL: Final = 1  # bumped when a frame's layout changes
AGENT_MAX_FRAME_BYTES: Final = 1 << 30  # a frame announcing more is refused
AGENT_THREADS: Final = 1  # torch intra-op threads of an agent (several share small devices)
AGENT_REPLY_TIMEOUT_S: Final = 600.0  # a message without a TTL waits this long for the agent
AGENT_ACCEPT_RETRY_S: Final = 0.1  # the agent's wait after a connection it could not take

#: What stops a daemon, or a command and the processes it started: systemd, ``timeout`` and
#: ``kill`` (SIGTERM), Ctrl-C (SIGINT), a closed terminal or SSH session (SIGHUP).
STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
