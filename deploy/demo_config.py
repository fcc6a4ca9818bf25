"""``fedstream demo``'s options, checked: :class:`DemoConfig` (the run settings it trains
with, and the recording or series its devices stream)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from deploy.brokers import (
    mosquitto_available,
)
from deploy.constants import (
    DEMO_CAPACITY,
    DEMO_DEVICES,
    DEMO_DURATION_S,
    DEMO_MAX_DEVICES,
    DEMO_OWNED,
    DEMO_SEED,
    DEMO_SETTINGS,
    DEMO_STREAMED,
    FORECAST_LR,
)
from edge_client.emulation.partitions import split_recording
from edge_client.emulation.reading_replay import series_channels
from edge_client.emulation.reading_styles import STYLES
from edge_client.runtime.constants import (
    COMMIT_INTERVAL_S,
    DEFAULT_POLICY,
    MAX_COMMIT_INTERVAL_S,
    POLICIES,
)
from edge_client.runtime.mqtt import BrokerURL
from edge_client.task.recordings import (
    Recording,
    load_recording,
    load_series,
    recording_keys,
    series_windows,
)
from edge_client.wire.mapping import kebab
from edge_client.wire.partitioning import scheme_of
from edge_client.wire.run_config import RunSettings

__all__ = ["DemoConfig", "device_ids"]


@dataclass
class DemoConfig:
    """Options of ``fedstream demo``.

    The training itself is configured like any run, by run-config keys: ``run_config``
    holds the overrides (``--rounds``, ``--controller``, ... and ``--run-config``), checked
    by :class:`~edge_client.wire.run_config.RunSettings` over the demo's own defaults
    (:data:`~deploy.constants.DEMO_SETTINGS`, ``b-min`` and ``min-nodes`` for the fleet).
    The checked result is :attr:`settings`. Keys the demo sets itself
    (:data:`~deploy.constants.DEMO_OWNED`) or that its streams fix
    (:data:`~deploy.constants.DEMO_STREAMED`) are refused.

    The devices stream the synthetic sensor task (scored on its held-out set too), or a
    user's recording (``source``: an ``.npz`` or ``.csv`` file, shuffled and split across
    the devices, or split by ``partition_by``, one device per group streaming its samples in
    recorded order, or by a Flower Datasets ``partition``): its sample shape and classes then
    set the run's, the model is the CNN for ``(channels, steps)`` windows and the MLP for any
    other shape (``--run-config model=`` chooses), each device standardises its stream by its
    own statistics (``preprocess``; ``--run-config preprocess=none`` turns it off), and a
    ``test`` file, when given, is what the aggregator scores on.
    """

    devices: int = DEMO_DEVICES
    duration: float = DEMO_DURATION_S
    rates: list[float] | None = None
    broker: str | None = None
    mosquitto: bool = False
    capacity: int = DEMO_CAPACITY
    policy: str = DEFAULT_POLICY
    out: Path = field(default_factory=lambda: Path("runs"))
    live: bool = True
    slowdowns: list[float] | None = None
    stream_only: bool = False
    run_config: dict[str, Any] = field(default_factory=dict)  # kebab-case overrides
    kill: dict[str, int] = field(default_factory=dict)  # device -> after which round
    restart: dict[str, int] = field(default_factory=dict)  # killed device -> back after round
    # device -> the round after which its agent is SIGKILLed mid-round, and started again
    kill_agent: dict[str, int] = field(default_factory=dict)
    labels: int | None = None  # non-IID: classes per device (round-robin over the fleet)
    dirichlet: float | None = None  # non-IID: Dirichlet(alpha) label mix per device
    secure: bool = False  # Mosquitto TLS + passwords + ACL, Flower TLS + SuperNode auth
    agent: bool = True  # one `fedstream agent` per device, holding torch and the model
    # ... which takes its SuperNode's tasks itself (False: each message's ClientApp process
    # hands over to it through its socket, the node config's agent)
    agent_tasks: bool = True
    kill_aggregator: int | None = None  # SIGKILL SuperLink + ServerApp after round N, resume
    # SIGKILL Mosquitto after round N, start it again DEMO_BROKER_OUTAGE_S later
    kill_broker: int | None = None
    source: Path | None = None  # a user's recording to stream instead of the synthetic task
    test: Path | None = None  # ... and a test file of it for the aggregator
    # ... split by a key (one device per group, in recorded order) or a Flower Datasets
    # partitioner (iid, dirichlet(A), pathological(K)); devices 0: one per group
    partition_by: str | None = None
    partition: str | None = None
    task: str = "classification"  # or forecast: a recorded series, windows cut from it
    window: int = 32  # forecast: readings per sample (the past and the horizon)
    # forecast: how the devices' sensors publish the series (reading_styles.STYLES)
    style: str = "json"
    commit_interval: float = COMMIT_INTERVAL_S  # the ingest daemons' --commit-interval
    settings: RunSettings = field(init=False)
    recording: Recording | None = field(init=False, default=None, repr=False)
    # forecast: the series (T, C), published reading by reading, and its channels' names
    series: np.ndarray | None = field(init=False, default=None, repr=False)
    channels: list[str] = field(init=False, default_factory=list)
    test_windows: np.ndarray | None = field(init=False, default=None, repr=False)
    # a partitioned recording: each device's samples (rows of the recording, in order), and
    # the group it streams
    parts: list[np.ndarray] | None = field(init=False, default=None, repr=False)
    groups: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.partition_by or self.partition:
            self._split()
        if not 1 <= self.devices <= DEMO_MAX_DEVICES:
            raise ValueError(f"--devices must be in 1..{DEMO_MAX_DEVICES}, got {self.devices}")
        if not self.duration > 0:
            raise ValueError(f"--duration must be > 0, got {self.duration}")
        if self.rates is None:  # heterogeneous by default
            pattern = (
                [50.0, 100.0, 200.0, 400.0] if self.stream_only else [400.0, 300.0, 200.0, 150.0]
            )
            self.rates = [pattern[i % 4] for i in range(self.devices)]
        if len(self.rates) != self.devices or min(self.rates) <= 0:
            raise ValueError(f"--rates needs {self.devices} positive values, got {self.rates}")
        if self.slowdowns is None:  # as OmniLearn's heterogeneity: two fast, one 2x, one 4x
            self.slowdowns = [[1.0, 1.0, 2.0, 4.0][i % 4] for i in range(self.devices)]
        if len(self.slowdowns) != self.devices or min(self.slowdowns) < 1:
            raise ValueError(f"--slowdowns needs {self.devices} values >= 1, got {self.slowdowns}")
        owned = sorted(set(self.run_config) & {kebab(k) for k in DEMO_OWNED})
        if owned:
            raise ValueError(
                f"the demo sets {owned} itself (--out chooses where the run goes; resume with "
                "fedstream resume)"
            )
        streamed = sorted(set(self.run_config) & {kebab(k) for k in DEMO_STREAMED})
        if streamed:
            raise ValueError(
                f"the demo's streams set {streamed}: stream a recording of another shape with "
                "--source FILE"
            )
        asked = RunSettings.from_run_config(
            {
                **{kebab(k): v for k, v in DEMO_SETTINGS.items()},
                **self._data_config(),
                **self.run_config,
            }
        )
        # Every device gets at least b-min: lower it for a fleet that B cannot give that.
        b_min = asked.b_min
        if kebab("b_min") not in self.run_config:
            b_min = max(1, min(b_min, asked.global_batch // self.devices))
        self.settings = replace(asked, b_min=b_min, min_nodes=self.devices)
        rounds = self.settings.num_rounds
        if rounds < 1:
            raise ValueError(
                "the demo runs a fixed number of rounds: num-rounds must be >= 1 (a run "
                "that trains until stopped is `fedstream serve` on a SuperLink)"
            )
        unknown = set(self.kill) - set(device_ids(self.devices))
        if unknown:
            raise ValueError(f"--kill names unknown devices {sorted(unknown)}")
        for dev, after in self.restart.items():
            if dev not in self.kill or after < self.kill[dev]:
                raise ValueError(f"--restart {dev}@{after} needs --kill {dev}@N with N <= {after}")
        unknown = set(self.kill_agent) - set(device_ids(self.devices))
        if unknown:
            raise ValueError(f"--kill-agent names unknown devices {sorted(unknown)}")
        if self.kill_agent and not self.agent:
            raise ValueError("--kill-agent needs the device agents (drop --no-agent)")
        if any(not 1 <= after < rounds for after in self.kill_agent.values()):
            raise ValueError(f"--kill-agent DEVICE@N takes N in 1..{rounds - 1}")
        if self.policy not in POLICIES:
            raise ValueError(f"--policy must be one of {POLICIES}")
        if self.capacity < 1:
            raise ValueError("--capacity must be >= 1")
        if not 0 < self.commit_interval <= MAX_COMMIT_INTERVAL_S:
            raise ValueError(
                f"the ingest commit interval must be in (0, {MAX_COMMIT_INTERVAL_S:g}] s"
            )
        classes = self.settings.num_classes
        if self.labels is not None and not 1 <= self.labels <= classes:
            raise ValueError(f"--labels must be in 1..{classes}")
        if self.labels is not None and self.dirichlet is not None:
            raise ValueError("give --labels or --dirichlet, not both")
        if self.dirichlet is not None and not self.dirichlet > 0:
            raise ValueError("--dirichlet must be > 0")
        if self.broker is not None:
            BrokerURL.parse(self.broker)
        if self.style not in STYLES:
            raise ValueError(f"--style must be one of {', '.join(STYLES)}")
        if self.style != "json" and (self.task != "forecast" or self.secure):
            raise ValueError(
                "--style replays a series as deployed sensors publish it: it goes with "
                "--task forecast, and not with --secure (whose ACL allows fedstream's topics)"
            )
        if self.secure and self.broker is not None:
            raise ValueError(
                "--secure starts its own Mosquitto with the run's credentials: drop --broker"
            )
        if self.kill_aggregator is not None and not 1 <= self.kill_aggregator < rounds:
            raise ValueError(f"--kill-aggregator must be in 1..{rounds - 1} (--rounds - 1)")
        if self.kill_broker is not None:
            if not 1 <= self.kill_broker < rounds:
                raise ValueError(f"--kill-broker must be in 1..{rounds - 1} (--rounds - 1)")
            if not (self.mosquitto or self.secure):
                raise ValueError("--kill-broker needs the demo's Mosquitto: add --mosquitto")
        if self.secure and not mosquitto_available():
            raise ValueError("--secure needs Mosquitto (apt-get install -y mosquitto)")

    def _split(self) -> None:
        """Split ``--source`` by ``--partition-by`` / ``--partition``: one device per part
        (``devices`` 0: one per group), each streaming its part in recorded order."""
        if self.source is None or self.task != "classification":
            raise ValueError("--partition-by and --partition split a recording: give --source")
        key = self.partition_by or ""
        scheme = scheme_of(self.partition or "", key)
        natural = scheme.kind == "natural"
        wanted = None if natural and not self.devices else (self.devices or DEMO_DEVICES)
        split = split_recording(
            str(self.source.resolve()), scheme, key=key, num_partitions=wanted, seed=DEMO_SEED
        )
        found = len(split.partitions)
        if wanted is not None and wanted > found:
            raise ValueError(f"--devices {wanted}, but {self.source} splits into {found}")
        self.devices = wanted or found
        if self.devices > DEMO_MAX_DEVICES:
            raise ValueError(
                f"{self.source} has {found} groups by {key!r}: the demo runs at most "
                f"{DEMO_MAX_DEVICES} devices (processes each); give --devices N for the first "
                "N, or run them all on Flower's simulation engine: fedstream simulate"
            )
        self.parts = [np.asarray(split.partitions.indices[i]) for i in range(self.devices)]
        self.groups = [split.device(i) for i in range(self.devices)]
        self.recording = (split.x, split.y)

    def _data_config(self) -> dict[str, Any]:
        """Run-config keys of what the devices stream: the synthetic task, scored on its
        held-out set, or the recording's shape and classes, scored on the test file.

        Raises
        ------
        ValueError
            If a file cannot be read, holds fewer samples than devices, or the test file's
            samples are not of the recording's shape or classes.
        """
        if self.source is None:
            if self.test is not None:
                raise ValueError("--test scores a recording: give its --source too")
            if self.task != "classification":
                raise ValueError(f"--task {self.task} learns from a recording: give --source")
            return {kebab("eval_data"): "synthetic"}
        if self.task == "forecast":
            return self._forecast_config(self.source, self.test)
        if self.task != "classification":
            raise ValueError(f"--task must be classification or forecast, got {self.task!r}")
        x, y = self.recording or load_recording(self.source)
        if len(x) < self.devices:
            raise ValueError(f"{self.source}: {len(x)} samples for {self.devices} devices")
        self.recording = (x, y)
        shape = tuple(int(d) for d in x.shape[1:])
        classes = max(2, int(y.max()) + 1)
        config: dict[str, Any] = {
            kebab("sample_shape"): ",".join(map(str, shape)),
            kebab("num_classes"): classes,
            kebab("model"): "cnn" if len(shape) == 2 else "mlp",
            # a recording is in its sensors' units: each device standardises its own stream
            kebab("preprocess"): "standardize",
            kebab("eval_data"): "",
        }
        if self.test is not None:
            key = self.partition_by
            x_test, y_test = load_recording(self.test, shape, group_key=key)
            if key and key in recording_keys(self.test):  # held-out groups scored apart
                config[kebab("eval_group_by")] = key
            if tuple(x_test.shape[1:]) != shape or int(y_test.max()) >= classes:
                raise ValueError(
                    f"{self.test}: samples of shape {tuple(x_test.shape[1:])} and labels up "
                    f"to {int(y_test.max())}; {self.source} has {shape} and {classes} classes"
                )
            config[kebab("eval_data")] = str(self.test.resolve())
        return config

    def _forecast_config(self, source: Path, test: Path | None) -> dict[str, Any]:
        """A recorded series, split in time across the devices, each publishing its stretch
        as per-reading JSON that its ingest daemon cuts into windows of ``window`` readings
        (stride 1, no labels); ``test``, a later stretch, is cut the same way for the
        aggregator."""
        series = load_series(source)
        if len(series) // self.devices < self.window:
            raise ValueError(
                f"{source}: {len(series)} readings make no window of {self.window} for each "
                f"of {self.devices} devices"
            )
        self.series, self.channels = series, series_channels(source)
        config: dict[str, Any] = {
            kebab("task"): "forecast",
            kebab("sample_shape"): f"{series.shape[1]},{self.window}",
            kebab("eval_data"): "",
            kebab("lr"): FORECAST_LR,  # --run-config lr=... still wins
        }
        if test is not None:
            test_windows = series_windows(load_series(test), self.window)
            if test_windows.shape[1] != series.shape[1]:
                raise ValueError(f"{test}: {test_windows.shape[1]} channels, {source} has "
                                 f"{series.shape[1]}")  # fmt: skip
            self.test_windows = test_windows  # eval-data: <run>/data/test.npz, with the shards
        return config

    @property
    def inject(self) -> bool:
        """Whether the devices take part in data injection (the run asks for it)."""
        return self.settings.inject_alpha > 0


def device_ids(n: int) -> list[str]:
    return [f"dev-{i}" for i in range(n)]
