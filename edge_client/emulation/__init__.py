"""Stream emulation: what stands in for sensors, kept apart from the device runtime.

- :mod:`~edge_client.emulation.publisher`: ``fedstream publish`` (samples at a rate, over MQTT);
- :mod:`~edge_client.emulation.reading_replay`: a recorded series as per-reading JSON;
- :mod:`~edge_client.emulation.reading_styles`: ... or as ESPHome, Zigbee2MQTT or Tasmota
  devices publish it (``fedstream publish --style``);
- :mod:`~edge_client.emulation.accelerometer`: a synthetic accelerometer series in raw
  counts (a forecasting task's test recording);
- :mod:`~edge_client.emulation.people`: a synthetic multi-subject activity recording laid
  out as UCI HAR's (subjects one after another, activities in blocks);
- :mod:`~edge_client.emulation.partitions`: a recording split across devices (natural by a
  key, or Flower Datasets' partitioners);
- :mod:`~edge_client.emulation.sources`: where samples come from (a task, a file, a
  dataset) and their label skew;
- :mod:`~edge_client.emulation.schedule`: stream rates (ScaDLES' sets) and arrival processes;
- :mod:`~edge_client.emulation.replay`, :mod:`~edge_client.emulation.simulation`: replayed
  streams for Flower's simulation engine;
- :mod:`~edge_client.emulation.virtual_stream`: streams on the in-process runner's virtual
  clock.

It feeds the runtime's buffers; the runtime never imports it. The simulation engine's
virtual devices (:class:`~edge_client.emulation.simulation.SimulationNodes`) reach the
ClientApp through the runtime's hook (:mod:`edge_client.runtime.virtual_nodes`), which the
app Flower loads (:mod:`edge_client.flower_app`) provides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_client.lazy import lazy_exports

if TYPE_CHECKING:
    from edge_client.emulation.people import People, people_recording
    from edge_client.emulation.publisher import PublisherConfig, PublishReport, run_publisher
    from edge_client.emulation.reading_replay import SeriesReadings, series_channels
    from edge_client.emulation.replay import replay_into
    from edge_client.emulation.schedule import arrival_offsets, draw_rate
    from edge_client.emulation.simulation import SimulationNodes, simulated_node
    from edge_client.emulation.sources import (
        ArraySource,
        SampleSource,
        SyntheticSource,
        dataset_source,
        label_distribution,
        pick_classes,
    )
    from edge_client.emulation.virtual_stream import VirtualStream, arrived

_EXPORTS = {
    "ArraySource": "sources",
    "People": "people",
    "PublishReport": "publisher",
    "PublisherConfig": "publisher",
    "SampleSource": "sources",
    "SeriesReadings": "reading_replay",
    "SimulationNodes": "simulation",
    "SyntheticSource": "sources",
    "VirtualStream": "virtual_stream",
    "arrival_offsets": "schedule",
    "arrived": "virtual_stream",
    "dataset_source": "sources",
    "draw_rate": "schedule",
    "label_distribution": "sources",
    "people_recording": "people",
    "pick_classes": "sources",
    "replay_into": "replay",
    "run_publisher": "publisher",
    "series_channels": "reading_replay",
    "simulated_node": "simulation",
}
__all__ = [
    "ArraySource",
    "People",
    "PublishReport",
    "PublisherConfig",
    "SampleSource",
    "SeriesReadings",
    "SimulationNodes",
    "SyntheticSource",
    "VirtualStream",
    "arrival_offsets",
    "arrived",
    "dataset_source",
    "draw_rate",
    "label_distribution",
    "people_recording",
    "pick_classes",
    "replay_into",
    "run_publisher",
    "series_channels",
    "simulated_node",
]
__getattr__ = lazy_exports(__name__, _EXPORTS)
