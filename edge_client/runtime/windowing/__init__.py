"""Per-reading streams into samples: what ``fedstream ingest --fields ... --window W`` does.

Simple sensors publish one reading per message; a sample is a window of readings. Between
the MQTT messages and the buffer:

- :mod:`~edge_client.runtime.windowing.spec`: topics, channels, window, stride, the gap,
  skew and label-wait tolerances (:class:`WindowSpec`);
- :mod:`~edge_client.runtime.windowing.align`: one or more topics onto one time base, with
  breaks where readings are missing (:class:`Aligner`);
- :mod:`~edge_client.runtime.windowing.windows`: rows into windows of ``W`` every ``S``,
  never across a break (:class:`Windower`);
- :mod:`~edge_client.runtime.windowing.labels`: labels joined by timestamp, with a bounded
  wait (:class:`LabelJoin`);
- :mod:`~edge_client.runtime.windowing.assembler`: the four together, with the state the
  ingest daemon commits beside the samples (:class:`WindowAssembler`).

The per-reading JSON itself is a wire contract: :mod:`edge_client.wire.readings`.
"""

from __future__ import annotations

from edge_client.runtime.windowing.align import Aligner
from edge_client.runtime.windowing.assembler import Assembled, WindowAssembler
from edge_client.runtime.windowing.labels import LabelJoin
from edge_client.runtime.windowing.spec import StreamSpec, WindowSpec, parse_topic
from edge_client.runtime.windowing.windows import Windower

__all__ = [
    "Aligner",
    "Assembled",
    "LabelJoin",
    "StreamSpec",
    "WindowAssembler",
    "WindowSpec",
    "Windower",
    "parse_topic",
]
