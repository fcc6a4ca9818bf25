"""The run config: every tunable of a run, declared once, checked in one place.

Flower hands the same run config (``[tool.flwr.app.config]`` in pyproject.toml, overridden
by ``flwr run --run-config``) to the ServerApp and to every ClientApp, so its declaration is
part of what both sides agree on and lives in the wire layer. Each key is a field declared
with :func:`~edge_client.wire.knob_checks.knob` (the key is the field name with dashes):
type, default, bounds or choices, and a line of help.

:class:`RunSettings` is composed of settings groups by concern
(:mod:`edge_client.wire.settings_groups`): ``settings.drift`` holds ``drift-reaction``,
``drift-boost`` and ``drift-rounds``, and each part of the aggregator is constructed from the
group it uses. The batch controller's knobs are :class:`ControllerSettings`, which
:class:`RunSettings` extends, and a few keys every part uses (``seed``, ``uplink-mbps``,
``proximal-mu``) are its own. The keys stay flat: ``RunSettings(drift_boost=3.0)`` and
``settings.drift_boost`` work as ever, and the run config's keys come in declaration order,
each group's in its place. :meth:`RunSettings.from_run_config` reads and checks a run
config; ``fedstream demo`` checks its training options the same way, and a test holds
pyproject.toml to these declarations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, Field, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from edge_client.wire import settings_groups as groups
from edge_client.wire.constants import (
    DIGITS_SHAPE,
    EQUAL_WEIGHT_AGGREGATIONS,
    ROBUST_AGGREGATIONS,
)
from edge_client.wire.knob_checks import (
    allowed,
    check_knobs,
    check_value,
    group,
    group_class,
    knob,
    knob_fields,
    number_list,
    parse_shape,
)
from edge_client.wire.mapping import MappingError, convert_fields, kebab
from edge_client.wire.settings_groups import ControllerSettings

__all__ = [
    "ControllerSettings",
    "RunSettings",
    "check_setting",
    "default",
    "knob",
    "knobs",
    "number_list",
    "parse_shape",
    "upgrade_saved",
]


@dataclass(frozen=True, init=False)
class RunSettings(ControllerSettings):
    """Every tunable of a run, by concern; the run-config key is the field name with dashes.

    Its fields are the controller's knobs (the base class), then the groups and the keys of
    its own, in the order of the run config. It takes flat keys
    (``RunSettings(num_rounds=4, drift_boost=3.0)``), groups (``drift=DriftSettings()``) or
    both (a flat key then overrides its group's value: ``dataclasses.replace(settings,
    export_dir=...)`` works), and reads flat keys too (``settings.drift_boost`` is
    ``settings.drift.drift_boost``). Defaults here are those of ``[tool.flwr.app.config]``
    in pyproject.toml (a test holds the two together).

    Raises
    ------
    ValueError
        If a key is out of bounds, or the keys break a rule among them; the message names
        the key.
    TypeError
        If a keyword names no key and no group.
    """

    rounds: groups.RoundSettings = group(groups.RoundSettings)
    asynchrony: groups.AsyncSettings = group(groups.AsyncSettings)
    learning: groups.LearningSettings = group(groups.LearningSettings)
    streams: groups.StreamSettings = group(groups.StreamSettings)
    exchange: groups.ExchangeSettings = group(groups.ExchangeSettings)
    checkpoints: groups.CheckpointSettings = group(groups.CheckpointSettings)
    metrics_log: groups.MetricsLogSettings = group(groups.MetricsLogSettings)
    sinks: groups.SinkSettings = group(groups.SinkSettings)
    exports: groups.ExportSettings = group(groups.ExportSettings)
    drift: groups.DriftSettings = group(groups.DriftSettings)
    evaluation: groups.EvaluationSettings = group(groups.EvaluationSettings)
    uplink_mbps: float = knob(10.0, "uplink charged on the virtual clock, Mbit/s", gt=0)
    seed: int = knob(0, "seed of the model, the held-out set and the draws", ge=0)
    codec: groups.CodecSettings = group(groups.CodecSettings)
    proximal_mu: float = knob(0.0, "FedProx term on the devices; 0: plain FedAvg", ge=0)
    injection: groups.InjectionSettings = group(groups.InjectionSettings)
    aggregation_rule: groups.AggregationSettings = group(groups.AggregationSettings)
    privacy: groups.PrivacySettings = group(groups.PrivacySettings)
    secure: groups.SecureAggregationSettings = group(groups.SecureAggregationSettings)
    simulation: groups.SimulationSettings = group(groups.SimulationSettings)

    if TYPE_CHECKING:
        # The grouped keys read flat, as type checkers see them (``settings.lr``, and
        # ``dataclasses.replace(settings, lr=...)``); at run time ``__getattr__`` and
        # ``__init__`` take them to their group. A test holds this list to the groups.
        _: KW_ONLY
        # rounds: RoundSettings
        num_rounds: int
        min_fresh_samples: int
        fraction_train: float
        max_diverged_rounds: int
        # asynchrony: AsyncSettings
        mode: str
        async_buffer: int
        staleness: str
        staleness_exponent: float
        staleness_hinge: int
        server_lr: float
        max_staleness: int
        # learning: LearningSettings
        local_steps: int
        lr: float
        task: str
        forecast_horizon: int
        model: str
        model_width: int
        personalize: str
        personal_layers: str
        sample_shape: str
        num_classes: int
        preprocess: str
        dataset: str
        # streams: StreamSettings
        wait_policy: str
        availability_cap: bool
        max_passes: int
        # exchange: ExchangeSettings
        round_timeout: float
        superlink_timeout: float
        min_nodes: int
        # checkpoints: CheckpointSettings
        checkpoint_dir: str
        resume: bool
        # metrics_log: MetricsLogSettings
        out_dir: str
        metrics_max_mb: float
        metrics_keep: int
        # sinks: SinkSettings
        prometheus_port: int
        prometheus_listen: str
        tensorboard_dir: str
        mlflow_uri: str
        mlflow_experiment: str
        # exports: ExportSettings
        export_dir: str
        export_every: int
        export_keep: int
        # drift: DriftSettings
        drift_reaction: str
        drift_boost: float
        drift_rounds: int
        # evaluation: EvaluationSettings
        eval_data: str
        eval_samples: int
        eval_group_by: str
        # codec: CodecSettings
        compress: str
        compress_ratio: float
        compress_delta: float
        compress_broadcast: str
        # injection: InjectionSettings
        inject_alpha: float
        inject_beta: float
        inject_budget: int
        inject_mix: float
        # aggregation_rule: AggregationSettings
        aggregation: str
        trim_fraction: float
        krum_malicious: int
        # privacy: PrivacySettings
        dp: str
        dp_clip: float
        dp_noise: float
        dp_delta: float
        dp_epsilon: float
        dp_clip_quantile: float
        dp_clip_lr: float
        dp_count_noise: float
        dp_device_records: bool
        dp_device_scores: bool
        # secure: SecureAggregationSettings
        secure_aggregation: bool
        secagg_neighbours: int
        secagg_threshold: float
        secagg_min_survivors: int
        secagg_range: float
        secagg_bits: int
        # simulation: SimulationSettings
        sim_dir: str
        sim_buffers: str
        sim_population: str
        sim_rates: str
        sim_slowdowns: str
        sim_initial: int
        sim_labels: int
        sim_dirichlet: float
        sim_feature_shift: float
        sim_source: str
        sim_partition: str
        sim_partition_by: str
        sim_round_s: float
        sim_secagg_dropout: float

    def __init__(self, **values: Any) -> None:
        overrides: dict[str, dict[str, Any]] = {}
        for name, value in values.items():
            holder = _GROUP_OF.get(name)
            if holder is not None:
                overrides.setdefault(holder, {})[name] = value
            elif name not in _OWN:
                raise TypeError(f"RunSettings got an unexpected keyword argument {name!r}")
        for f in fields(RunSettings):
            cls = group_class(f)
            if cls is None:
                value = values.get(f.name, f.default)
            else:  # the group given (or its defaults), with the flat keys given over it
                given = values.get(f.name)
                flat = overrides.get(f.name, {})
                value = cls(**flat) if given is None else replace(given, **flat) if flat else given
            object.__setattr__(self, f.name, value)
        self.__post_init__()

    def __post_init__(self) -> None:
        super().__post_init__()
        check_knobs(self, RunSettings)
        mode, aggregation = self.asynchrony.mode, self.aggregation_rule.aggregation
        if mode == "async" and aggregation in ROBUST_AGGREGATIONS:
            raise ValueError(
                f"aggregation {aggregation} needs every update of a round: async mode "
                "takes adaptive, fedavg or fednova"
            )
        personal = self.learning.personalize != "none" or self.learning.personal_layers.strip()
        if mode == "async" and personal:
            raise ValueError(
                "personalize / personal-layers work in sync mode only (mode = 'sync'): "
                "async aggregation does not yet keep personal layers out of its buffer"
            )
        if self.simulation.sim_labels > self.learning.num_classes:
            raise ValueError(f"sim-labels must be in 0..num-classes ({self.learning.num_classes})")
        if mode == "async" and self.rounds.fraction_train < 1:
            raise ValueError(
                "fraction-train < 1 works in sync mode only: async mode gives every idle "
                "device work as it comes back"
            )
        if self.privacy.on:
            self._check_private()
        if self.secure.secure_aggregation:
            self._check_secure()

    def _check_private(self) -> None:
        """Refuse, one line each, what differential privacy cannot cover."""
        dp = f"dp = {self.privacy.dp!r}"
        if self.privacy.dp_noise <= 0:
            raise ValueError(
                f"{dp} needs dp-noise > 0: without noise there is no guarantee (epsilon is "
                "infinite)"
            )
        if self.injection.inject_alpha > 0:
            raise ValueError(
                f"{dp} refuses data injection (inject-alpha > 0): for privacy, raw samples "
                "would leave the device over the broker, outside any guarantee"
            )
        if self.aggregation_rule.aggregation not in EQUAL_WEIGHT_AGGREGATIONS:
            raise ValueError(
                f"{dp} needs aggregation = 'adaptive' or 'fednova' (under DP both are the "
                "equal-weight mean DP-FedAvg analyses): "
                f"{self.aggregation_rule.aggregation} gives a device a weight of its "
                "own (its samples, or a robust rule's pick), which the noise does not cover"
            )
        if self.asynchrony.mode == "async":
            raise ValueError(
                f"{dp} works in sync mode only: FedBuff's buffered, stale-weighted updates "
                "have no accounting here"
            )
        if self.drift.drift_reaction != "none":
            raise ValueError(
                f"{dp} needs drift-reaction = 'none': the reaction follows a device's own "
                "drift reports, which no noise covers"
            )
        if self.codec.compress == "adaptive":
            raise ValueError(
                f"{dp} refuses compress = 'adaptive': the round's codec follows each "
                "device's top-k gap, which no noise covers (pick topk, int8, fp16 or none)"
            )

    def _check_secure(self) -> None:
        """Refuse, one line each, what cannot be combined with masked updates (the
        aggregator sees only their sum)."""
        what = "secure-aggregation"
        if self.asynchrony.mode == "async":
            raise ValueError(
                f"{what} works in sync mode only: FedBuff folds in each update as it comes, "
                "and a masked update alone unmasks to nothing"
            )
        aggregation = self.aggregation_rule.aggregation
        if aggregation in ROBUST_AGGREGATIONS:
            raise ValueError(
                f"{what} refuses aggregation = {aggregation!r}: a robust rule looks at each "
                "update, and the aggregator sees only their sum (use adaptive, fednova or "
                "fedavg)"
            )
        compress = self.codec.compress
        if compress in ("topk", "adaptive"):
            raise ValueError(
                f"{what} refuses compress = {compress!r}: each device's top-k coordinates "
                "differ, and masks only cancel over the same coordinates (use compress = "
                "'none': updates are quantised to secagg-bits instead)"
            )
        if compress != "none":
            raise ValueError(
                f"{what} quantises updates on its own grid (secagg-bits, secagg-range): set "
                f"compress = 'none' instead of {compress!r}"
            )
        if self.drift.drift_reaction != "none":
            raise ValueError(
                f"{what} needs drift-reaction = 'none': the reaction reweighs one device's "
                "update, and the aggregator cannot reach one update inside the sum"
            )
        if self.injection.inject_alpha > 0:
            raise ValueError(
                f"{what} refuses data injection (inject-alpha > 0): it would send raw "
                "samples over the broker, past the masking that keeps updates private"
            )
        if self.privacy.dp_clip_quantile > 0:
            raise ValueError(
                f"{what} refuses dp-clip-quantile (adaptive clipping): it reads each "
                "device's within-the-clip bit in the clear"
            )
        if self.privacy.dp == "local":
            raise ValueError(
                f"{what} refuses dp = 'local': a device's noise (dp-noise x dp-clip a "
                "coordinate) would be cut at the grid's range, dp-clip, which biases the sum; "
                "local DP already keeps each update from the aggregator (use dp = 'central' "
                "with secure aggregation, or local DP alone)"
            )

    if not TYPE_CHECKING:  # type checkers read the flat keys declared above instead

        def __getattr__(self, name: str) -> Any:
            # Only for a flat key read (``settings.lr``): its group holds it. Anything else,
            # a dunder that pickle or copy probes on a bare instance included, is not here.
            holder = _GROUP_OF.get(name)
            if holder is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            return getattr(object.__getattribute__(self, holder), name)

    @property
    def shape(self) -> tuple[int, ...]:
        """``sample-shape`` as a tuple (see :attr:`LearningSettings.shape`)."""
        return self.learning.shape

    def to_run_config(self) -> dict[str, Any]:
        """The settings as a run config (kebab-case keys, in declaration order): what a
        resume submits again."""
        return {kebab(f.name): _flat_value(self, f.name) for f in knob_fields(self)}

    @classmethod
    def from_run_config(cls, config: Mapping[str, Any]) -> RunSettings:
        """Read settings from a run config; keys it does not set take their defaults.

        Raises
        ------
        ValueError
            On an unknown key (likely a typo), a value of the wrong type, or one out of
            bounds; the message names the key.
        """
        unknown = sorted(set(config) - set(_KEYS))
        if unknown:
            raise ValueError(f"run config: unknown keys {unknown}; known: {sorted(_KEYS)}")
        values: dict[str, Any] = {}
        try:
            for declared in (RunSettings, *_GROUP_CLASSES):
                values.update(convert_fields(declared, config))
        except MappingError as err:
            raise ValueError(f"run config: {err}") from err
        return cls(**values)


def _flat_value(settings: RunSettings, name: str) -> Any:
    holder = _GROUP_OF.get(name)
    return getattr(getattr(settings, holder) if holder else settings, name)


def upgrade_saved(config: Mapping[str, Any]) -> dict[str, Any]:
    """A run config saved by an earlier fedstream (a checkpoint's), with the keys added since
    set to what that release did: before ``sample-shape`` and ``eval-data`` existed, the
    model's shape was the ``dataset``'s and the aggregator scored every round on the
    ``dataset``'s held-out set."""
    out = dict(config)
    dataset = out.get(kebab("dataset"), default("dataset"))
    if kebab("sample_shape") not in out and dataset == "digits":
        out[kebab("sample_shape")] = ",".join(map(str, DIGITS_SHAPE))
    if kebab("eval_data") not in out:
        out[kebab("eval_data")] = dataset
    return out


def knobs(settings: type[Any] = RunSettings) -> dict[str, dict[str, Any]]:
    """Every run-config key and what is declared about it.

    Parameters
    ----------
    settings : type
        The settings class (all of a run's by default), or one group of it.

    Returns
    -------
    dict
        Key -> ``default``, ``help`` and ``allowed`` (the choices or the bounds, as text;
        empty when any value of the key's type goes), in declaration order.
    """
    return {
        kebab(f.name): {
            "default": f.default,
            "help": f.metadata["help"],
            "allowed": allowed(f.metadata),
        }
        for f in knob_fields(settings)
    }


def check_setting(name: str, value: Any) -> None:
    """Check ``value`` as run-config key ``name`` (a field name) would be checked: for
    records that carry a setting on its way (a device's plan).

    Raises
    ------
    ValueError
        If it is out of the key's bounds or choices; the message names the key.
    """
    check_value(kebab(name), value, _KEYS[kebab(name)].metadata)


def default(name: str) -> Any:
    """The declared default of run-config key ``name`` (a field name)."""
    return _KEYS[kebab(name)].default


#: Every key's field, by key, in declaration order.
_KEYS: dict[str, Field[Any]] = {kebab(f.name): f for f in knob_fields(RunSettings)}
#: RunSettings's own fields (the controller's knobs, the groups, its own keys).
_OWN = frozenset(f.name for f in fields(RunSettings))
#: A grouped key's field name -> the attribute of the group that holds it.
_GROUP_OF: dict[str, str] = {
    k.name: f.name
    for f in fields(RunSettings)
    if (c := group_class(f)) is not None
    for k in fields(c)
}
_GROUP_CLASSES = tuple(c for f in fields(RunSettings) if (c := group_class(f)) is not None)
