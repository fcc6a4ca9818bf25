"""What the device and the aggregator exchange, and what every side agrees on.

- :mod:`~edge_client.wire.frames`: sample frames (binary and JSON), what sensors publish;
- :mod:`~edge_client.wire.readings`: per-reading JSON, what simple sensors publish;
- :mod:`~edge_client.wire.codec`: update frames (a model delta, compressed and checked);
- :mod:`~edge_client.wire.records`: the round plan and the device's reply, as typed records;
- :mod:`~edge_client.wire.run_config`: every run-config key, declared once, composed by
  concern of the groups in :mod:`~edge_client.wire.settings_groups` (how a key is declared
  and checked: :mod:`~edge_client.wire.knob_checks`);
- :mod:`~edge_client.wire.mapping`: the one kebab-case mapping records are written through;
- :mod:`~edge_client.wire.topics`: MQTT topics, device ids and client ids;
- :mod:`~edge_client.wire.artifact`: versioned model exports (``torch.export`` programs with
  a manifest): the aggregator and the ClientApp write them, ``fedstream infer`` reads them
  with torch alone;
- :mod:`~edge_client.wire.constants`: formats, versions and vocabularies.

Both the device runtime and the aggregator import it; it imports neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_client.lazy import lazy_exports

if TYPE_CHECKING:
    from edge_client.wire.artifact import (
        ArtifactError,
        LoadedModel,
        ModelVersion,
        latest_version,
        list_versions,
        load_version,
        write_version,
    )
    from edge_client.wire.codec import (
        CodecError,
        Compressed,
        FeedbackState,
        compress,
        raw_size_limit,
        topk_gap,
    )
    from edge_client.wire.frames import (
        Arrivals,
        FrameError,
        SampleBatch,
        decode_messages,
        decode_payload,
        encode_frame,
        encode_json,
    )
    from edge_client.wire.mapping import MappingError, from_mapping, kebab, to_mapping
    from edge_client.wire.readings import (
        FieldPath,
        Reading,
        ReadingFormat,
        decode_readings,
        encode_readings,
        parse_fields,
    )
    from edge_client.wire.records import (
        ARRAYS,
        CONFIG,
        DEVICE,
        METRICS,
        UPDATE,
        DeviceReply,
        RecordError,
        ReplyMetrics,
        RoundPlan,
    )
    from edge_client.wire.run_config import (
        ControllerSettings,
        RunSettings,
        check_setting,
        default,
        knob,
        knobs,
        number_list,
        parse_shape,
    )
    from edge_client.wire.settings_groups import (
        AggregationSettings,
        AsyncSettings,
        CheckpointSettings,
        CodecSettings,
        DriftSettings,
        EvaluationSettings,
        ExchangeSettings,
        ExportSettings,
        InjectionSettings,
        LearningSettings,
        MetricsLogSettings,
        RoundSettings,
        SimulationSettings,
        SinkSettings,
        StreamSettings,
    )
    from edge_client.wire.topics import (
        check_topic,
        client_id,
        predictions_topic,
        samples_topic,
        status_topic,
        validate_device_id,
    )

_EXPORTS = {
    "ArtifactError": "artifact",
    "LoadedModel": "artifact",
    "ModelVersion": "artifact",
    "latest_version": "artifact",
    "list_versions": "artifact",
    "load_version": "artifact",
    "write_version": "artifact",
    "predictions_topic": "topics",
    "parse_fields": "readings",
    "encode_readings": "readings",
    "decode_readings": "readings",
    "ReadingFormat": "readings",
    "Reading": "readings",
    "FieldPath": "readings",
    "check_setting": "run_config",
    "default": "run_config",
    "ARRAYS": "records",
    "CONFIG": "records",
    "DEVICE": "records",
    "METRICS": "records",
    "UPDATE": "records",
    "Arrivals": "frames",
    "CodecError": "codec",
    "Compressed": "codec",
    "ControllerSettings": "run_config",
    "DeviceReply": "records",
    "FeedbackState": "codec",
    "FrameError": "frames",
    "MappingError": "mapping",
    "RecordError": "records",
    "ReplyMetrics": "records",
    "RoundPlan": "records",
    "RunSettings": "run_config",
    "SampleBatch": "frames",
    "compress": "codec",
    "decode_messages": "frames",
    "decode_payload": "frames",
    "encode_frame": "frames",
    "encode_json": "frames",
    "from_mapping": "mapping",
    "kebab": "mapping",
    "knob": "run_config",
    "knobs": "run_config",
    "number_list": "run_config",
    "parse_shape": "run_config",
    "AggregationSettings": "settings_groups",
    "AsyncSettings": "settings_groups",
    "CheckpointSettings": "settings_groups",
    "CodecSettings": "settings_groups",
    "DriftSettings": "settings_groups",
    "EvaluationSettings": "settings_groups",
    "ExchangeSettings": "settings_groups",
    "ExportSettings": "settings_groups",
    "InjectionSettings": "settings_groups",
    "LearningSettings": "settings_groups",
    "MetricsLogSettings": "settings_groups",
    "RoundSettings": "settings_groups",
    "SimulationSettings": "settings_groups",
    "SinkSettings": "settings_groups",
    "StreamSettings": "settings_groups",
    "raw_size_limit": "codec",
    "samples_topic": "topics",
    "status_topic": "topics",
    "check_topic": "topics",
    "client_id": "topics",
    "to_mapping": "mapping",
    "topk_gap": "codec",
    "validate_device_id": "topics",
}
__all__ = [
    "ARRAYS",
    "CONFIG",
    "DEVICE",
    "METRICS",
    "UPDATE",
    "AggregationSettings",
    "Arrivals",
    "ArtifactError",
    "AsyncSettings",
    "CheckpointSettings",
    "CodecError",
    "CodecSettings",
    "Compressed",
    "ControllerSettings",
    "DeviceReply",
    "DriftSettings",
    "EvaluationSettings",
    "ExchangeSettings",
    "ExportSettings",
    "FeedbackState",
    "FieldPath",
    "FrameError",
    "InjectionSettings",
    "LearningSettings",
    "LoadedModel",
    "MappingError",
    "MetricsLogSettings",
    "ModelVersion",
    "Reading",
    "ReadingFormat",
    "RecordError",
    "ReplyMetrics",
    "RoundPlan",
    "RoundSettings",
    "RunSettings",
    "SampleBatch",
    "SimulationSettings",
    "SinkSettings",
    "StreamSettings",
    "check_setting",
    "check_topic",
    "client_id",
    "compress",
    "decode_messages",
    "decode_payload",
    "decode_readings",
    "default",
    "encode_frame",
    "encode_json",
    "encode_readings",
    "from_mapping",
    "kebab",
    "knob",
    "knobs",
    "latest_version",
    "list_versions",
    "load_version",
    "number_list",
    "parse_fields",
    "parse_shape",
    "predictions_topic",
    "raw_size_limit",
    "samples_topic",
    "status_topic",
    "to_mapping",
    "topk_gap",
    "validate_device_id",
    "write_version",
]
__getattr__ = lazy_exports(__name__, _EXPORTS)
