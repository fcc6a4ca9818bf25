"""``fedstream infer`` against a real broker: a prediction for every sample, a newer model
version picked up while running, a broker restart survived, bad payloads counted."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy.brokers import MosquittoBroker
from deploy.local import ProcessGroup, fedstream_command, wait_until
from deploy.probes import MqttProbe
from edge_client.runtime.model_store import store_model
from edge_client.task.interface import Classification, init_model
from edge_client.wire.frames import encode_frame, encode_json
from edge_client.wire.run_config import RunSettings
from edge_client.wire.topics import predictions_topic, samples_topic

DEVICE = "dev-a"
SHAPE = (6, 32)


def _version(model_dir: Path, version: int, seed: int) -> None:
    """Keep a CNN initialised from ``seed`` as ``version``, as a device's ClientApp would."""
    settings = RunSettings(model_width=8)
    task = Classification(width=8)
    model = init_model(task, settings.shape, settings.num_classes, seed)
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    assert store_model(model_dir, task, settings, weights, version, DEVICE, None) is not None


def _predictions(probe: MqttProbe) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in list(probe.messages)]


def _publish_frames(probe: MqttProbe, first: int, count: int, per_message: int = 4) -> None:
    rng = np.random.default_rng(first)
    for i in range(first, first + count):
        ts = 1_700_000_000.0 + i * per_message + np.arange(per_message)
        x = rng.normal(size=(per_message, *SHAPE))
        probe.publish(samples_topic(DEVICE), encode_frame(x, np.zeros(per_message, int), ts))


@pytest.mark.mosquitto
def test_infer_predicts_every_sample_follows_new_versions_and_outlives_the_broker(
    procs: ProcessGroup, tmp_path: Path
) -> None:
    # Prepare: a model directory with version 1; Mosquitto; the daemon; a probe on the
    # predictions topic.
    models = tmp_path / "models"
    _version(models, 1, seed=0)
    with MosquittoBroker() as broker:
        log = tmp_path / "infer.log"
        procs.start(
            "infer",
            fedstream_command(
                "infer", "--broker", broker.url, "--device-id", DEVICE, "--model", str(models),
                "--drift", "none",
            ),
            log_path=log,
        )  # fmt: skip
        probe = MqttProbe(broker.url, "probe")
        probe.subscribe(predictions_topic(DEVICE))
        assert wait_until(lambda: "connected to" in log.read_text(), 60), log.read_text()

        # Execute 1: 25 frames of 4 samples, a malformed payload, a sample of the wrong
        # shape, and one JSON sample.
        _publish_frames(probe, 0, 25)
        probe.publish(samples_topic(DEVICE), b"\x00garbage")
        probe.publish(samples_topic(DEVICE), encode_frame(np.zeros((1, 3, 3)), [0], [1.0]))
        probe.publish(samples_topic(DEVICE), encode_json(np.ones(SHAPE), 2, ts=42.0))
        # Assert 1: every valid sample predicted once, by version 1, with its timestamp.
        assert wait_until(
            lambda: sum(len(p["predictions"]) for p in _predictions(probe)) >= 101, 30
        )
        time.sleep(0.5)
        got = [e for p in _predictions(probe) for e in p["predictions"]]
        assert len(got) == 101
        assert {p["model-version"] for p in _predictions(probe)} == {1}
        assert sorted(e["ts"] for e in got)[-1] == 1_700_000_000.0 + 99
        assert 42.0 in {e["ts"] for e in got}
        for e in got:
            assert 0 <= e["label"] < 6 and math.isclose(sum(e["probabilities"]), 1.0, abs_tol=1e-4)
            assert 0 <= e["latency-s"] < 10

        # Execute 2: a newer version appears while it runs.
        _version(models, 2, seed=1)

        # Assert 2: it is picked up (the directory is polled every 2 s) and predicts.
        def on_version_2() -> bool:
            _publish_frames(probe, 100, 1)
            return any(p["model-version"] == 2 for p in _predictions(probe))

        assert wait_until(on_version_2, 30, interval=0.5), log.read_text()

        # Execute 3: the broker goes down and comes back.
        probe.close()
        broker.kill()
        time.sleep(1.0)
        broker.restart()
        after = MqttProbe(broker.url, "probe-2")
        after.subscribe(predictions_topic(DEVICE))

        # Assert 3: the daemon reconnected, subscribed again and predicts new samples.
        def predicted_again() -> bool:
            _publish_frames(after, 200, 1)
            return bool(after.messages)

        assert wait_until(predicted_again, 60, interval=1.0), log.read_text()
        after.close()
        text = log.read_text()
        assert "model version 2" in text and "reconnecting" in text
        assert procs.procs["infer"].poll() is None
