"""The strategy with mock replies, as Flower's own strategy tests are written: plan a round
with ``configure_train`` on a grid that only lists nodes, answer its messages, and read what
``aggregate_train`` returns."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, RecordDict

from aggregator.strategy import StreamStrategy
from deploy.inprocess import StaticGrid
from deploy.probes import nan_frame
from edge_client.wire.records import CONFIG, DEVICE, RoundPlan
from edge_client.wire.run_config import RunSettings
from tests.helpers import mock_reply

Fast = Callable[..., RunSettings]

MODEL = {"w": np.zeros(2, np.float32), "b": np.zeros(1, np.float32)}


def model() -> ArrayRecord:
    return ArrayRecord({k: Array(v) for k, v in MODEL.items()})


def plan_round(
    strategy: StreamStrategy, grid: StaticGrid, server_round: int = 1
) -> dict[int, Message]:
    """The round's messages by destination node."""
    asks = strategy.configure_train(server_round, model(), ConfigRecord(), grid)
    return {m.metadata.dst_node_id: m for m in asks}


def test_aggregate_is_the_sample_weighted_average_of_valid_updates(fast: Fast) -> None:
    # Prepare: three devices; z's update holds a NaN and must be left out.
    strategy = StreamStrategy(fast(aggregation="fedavg"))
    asks = plan_round(strategy, StaticGrid([1, 2, 3]))
    replies = [
        mock_reply(asks[1], "x", {"w": [1.0, 2.0], "b": [0.0]}, 10),
        mock_reply(asks[2], "y", {"w": [4.0, 8.0], "b": [3.0]}, 30),
        mock_reply(asks[3], "z", num_examples=60, frame=nan_frame(MODEL)),
    ]
    # Execute
    new, report = strategy.aggregate_train(1, replies)
    # Assert: (10 * x + 30 * y) / 40 on top of the (zero) global model
    assert new is not None
    got = new.to_numpy_ndarrays()
    np.testing.assert_allclose(got[0], [3.25, 6.5])
    np.testing.assert_allclose(got[1], [2.25])
    assert report.num_examples == 40 and report.aggregated == ["x", "y"]
    assert report.refused == {"z": "non-finite"} and set(report.replies) == {"x", "y"}
    assert strategy.fleet.rejected == {"z": 1}
    assert strategy.fleet.rejected_reasons == {"non-finite": 1}


def test_a_diverged_device_and_a_non_finite_update_are_refused_and_counted_as_diverged(
    fast: Fast,
) -> None:
    # Prepare: x trained well; y says its training diverged (and sends no update); z sends
    # an update holding a NaN (an older device that does not say so).
    strategy = StreamStrategy(fast(aggregation="fedavg"))
    asks = plan_round(strategy, StaticGrid([1, 2, 3]))
    replies = [
        mock_reply(asks[1], "x", {"w": [1.0, 2.0], "b": [1.0]}, 10),
        mock_reply(asks[2], "y", num_examples=10, frame=b"", train_diverged=1, train_loss=1e9),
        mock_reply(asks[3], "z", num_examples=10, frame=nan_frame(MODEL)),
    ]
    # Execute
    new, report = strategy.aggregate_train(1, replies)
    # Assert: only x's update moves the model; y and z are refused by reason and both are
    # the round's diverged devices; y's reply is kept (its scores, its timings), but not
    # its loss or samples
    assert new is not None and report.aggregated == ["x"]
    np.testing.assert_allclose(new.to_numpy_ndarrays()[0], [1.0, 2.0])
    assert report.refused == {"y": "diverged", "z": "non-finite"}
    assert report.diverged == ["y", "z"] and set(report.replies) == {"x", "y"}
    assert (report.num_examples, report.train_loss) == (10, 1.0)
    assert strategy.fleet.rejected_reasons == {"diverged": 1, "non-finite": 1}


def test_error_malformed_newer_and_missing_replies_are_counted_not_averaged(fast: Fast) -> None:
    # Prepare: four devices known from round 1; in round 2 one sends an error, one a reply
    # without its device record, one a reply of a newer format, one nothing.
    strategy = StreamStrategy(fast())
    grid = StaticGrid([1, 2, 3, 4, 5])
    asks = plan_round(strategy, grid)
    strategy.aggregate_train(1, [mock_reply(asks[n], f"d{n}", MODEL, 10) for n in asks])
    asks = plan_round(strategy, grid, 2)
    sent = dict(zip(grid.push_messages(list(asks.values())), asks, strict=True))
    broken = mock_reply(asks[2], "d2", MODEL, 10)
    del broken.content[DEVICE]
    newer = mock_reply(asks[3], "d3", MODEL, 10)
    newer.content.config_records[DEVICE]["format-version"] = 99
    replies = [
        mock_reply(asks[5], "d5", {"w": [2.0, 2.0], "b": [2.0]}, 10),
        Message(Error(code=0, reason="device offline"), reply_to=asks[1]),
        broken,
        newer,
    ]  # d4: no reply before the timeout
    # Execute
    new, report = strategy.aggregate_train(2, replies, sent)
    # Assert
    assert new is not None and report.aggregated == ["d5"]
    np.testing.assert_allclose(new.to_numpy_ndarrays()[0], [2.0, 2.0])
    assert sorted(report.failed) == ["d1", "d4"]
    assert report.refused == {"d2": "malformed", "d3": "newer-format"}
    assert strategy.fleet.failed == {"d1": 1, "d4": 1}


def test_a_device_back_on_a_new_node_retires_its_old_node(fast: Fast) -> None:
    # Prepare: dev-0 served node 100; its SuperNode restarts as node 103 while the SuperLink
    # still lists the dead node.
    strategy = StreamStrategy(fast())
    grid = StaticGrid([100, 101, 102])
    asks = plan_round(strategy, grid)
    strategy.aggregate_train(1, [mock_reply(asks[n], f"dev-{n - 100}", MODEL) for n in asks])
    grid.node_ids.append(103)
    asks = plan_round(strategy, grid, 2)
    sent = dict(zip(grid.push_messages(list(asks.values())), asks, strict=True))
    replies = [mock_reply(asks[n], d, MODEL) for n, d in ((101, "dev-1"), (102, "dev-2"))]
    # Execute: dev-0 answers from its new node; its dead node's message gets no reply
    assert 100 in asks
    answers = [*replies, mock_reply(asks[103], "dev-0", MODEL)]
    _, report = strategy.aggregate_train(2, answers, sent)
    third = plan_round(strategy, grid, 3)
    # Assert: the dead node's lost message fails as dev-0's (not an anonymous node's); it
    # gets no message after (no round timeout spent on it); its device keeps its controller
    # state under its id.
    assert report.failed == ["dev-0"] and strategy.fleet.failed == {"dev-0": 1}
    assert sorted(third) == [101, 102, 103]
    assert strategy.fleet.retired == {100} and strategy.fleet.node_devices[103] == "dev-0"
    assert set(strategy.controller.devices) == {"dev-0", "dev-1", "dev-2"}


def test_a_robust_rule_leaves_out_an_outlier_the_mean_would_take(fast: Fast) -> None:
    # Prepare: five devices, one with a huge update.
    strategy = StreamStrategy(fast(aggregation="krum", krum_malicious=1))
    asks = plan_round(strategy, StaticGrid([1, 2, 3, 4, 5]))
    honest = [mock_reply(asks[n], f"d{n}", {"w": [1.0, 1.0], "b": [1.0]}, 10) for n in (1, 2, 3)]
    close = mock_reply(asks[4], "d4", {"w": [1.1, 0.9], "b": [1.0]}, 10)
    hostile = mock_reply(asks[5], "d5", {"w": [1e3, -1e3], "b": [1e3]}, 10)
    # Execute
    new, report = strategy.aggregate_train(1, [*honest, close, hostile])
    # Assert
    assert new is not None and len(report.aggregated) == 1 and "d5" not in report.aggregated
    assert np.abs(new.to_numpy_ndarrays()[0]).max() < 2


def test_plans_follow_the_reported_gaps_opt_ins_and_streams(fast: Fast) -> None:
    # Prepare: adaptive compression, injection among opted-in devices, the availability cap.
    # Round 1 reports small top-k gaps, d1 opted in, and streams that can deliver 90 + 5 x 2
    # (d1) and 80 + 10 x 2 (d2) samples by the end of a 2 s round: 20 per step of 5.
    settings = fast(compress="adaptive", compress_delta=0.5, inject_alpha=1.0)
    strategy = StreamStrategy(settings)
    grid = StaticGrid([1, 2])
    asks = plan_round(strategy, grid)
    first = [RoundPlan.from_record(m.content.config_records[CONFIG]) for m in asks.values()]
    strategy.aggregate_train(
        1,
        [
            mock_reply(asks[1], "d1", MODEL, 32, compress_gap=0.1, inject_opt_in=1,
                       buffer_fill=90, stream_rate=5.0),
            mock_reply(asks[2], "d2", MODEL, 32, compress_gap=0.2, buffer_fill=80,
                       stream_rate=10.0),
        ],
    )  # fmt: skip
    strategy.record_round_time(2.0)
    # Execute
    second = {
        n: RoundPlan.from_record(m.content.config_records[CONFIG])
        for n, m in plan_round(strategy, grid, 2).items()
    }
    # Assert: dense without reports, top-k once most gaps are within delta; only the opted-in
    # device shares; both batches capped at 20, the learning rate scaled by 40 / B.
    assert {p.compress for p in first} == {"none"}
    assert {p.compress for p in second.values()} == {"topk"}
    assert second[1].inject_publish and not second[2].inject_publish
    assert (second[1].batch_size, second[2].batch_size) == (20, 20)
    assert second[1].lr == pytest.approx(settings.lr * 40 / settings.global_batch)


def test_a_reply_to_an_unplanned_round_is_refused_loudly(fast: Fast) -> None:
    strategy = StreamStrategy(fast())
    with pytest.raises(RuntimeError, match="not configured"):
        strategy.aggregate_train(1, [Message(RecordDict(), 1, "train")])


def test_a_device_claiming_more_samples_than_planned_weighs_as_planned(fast: Fast) -> None:
    # Prepare: fedavg over two devices planned 32 samples a step each for 5 steps (160
    # samples); x claims a million.
    strategy = StreamStrategy(fast(aggregation="fedavg"))
    asks = plan_round(strategy, StaticGrid([1, 2]))
    planned = strategy.planned_batch(1) * strategy.settings.local_steps
    replies = [
        mock_reply(asks[1], "x", {"w": [4.0, 0.0], "b": [0.0]}, 1_000_000),
        mock_reply(asks[2], "y", {"w": [0.0, 4.0], "b": [0.0]}, planned),
    ]
    # Execute
    new, _ = strategy.aggregate_train(1, replies)
    # Assert: the claim buys no weight beyond the plan: an even mean
    assert new is not None and planned == 160
    np.testing.assert_allclose(new.to_numpy_ndarrays()[0], [2.0, 2.0])


def test_the_adaptive_rule_records_the_ratio_it_weighed_by(fast: Fast) -> None:
    # Prepare: the default rule, a fresh estimate (r = 0: equal weights).
    strategy = StreamStrategy(fast())
    asks = plan_round(strategy, StaticGrid([1, 2]))
    replies = [
        mock_reply(asks[1], "x", {"w": [4.0, 0.0], "b": [0.0]}, 20),
        mock_reply(asks[2], "y", {"w": [0.0, 4.0], "b": [0.0]}, 160),
    ]
    # Execute
    new, report = strategy.aggregate_train(1, replies)
    # Assert
    assert strategy.settings.aggregation == "adaptive" and report.weight_ratio == 0.0
    assert new is not None
    np.testing.assert_allclose(new.to_numpy_ndarrays()[0], [2.0, 2.0])
