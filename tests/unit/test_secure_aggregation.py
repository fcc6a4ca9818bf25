"""Secure aggregation (SecAgg+): the arithmetic, the unmasked sum against the devices' own
inputs, dropouts at each stage, bad input at each stage, and what it refuses to combine
with. Devices are real ClientApps on the in-process grid, with their buffer files."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message

from aggregator.round_log import RoundRecord, read_metrics, rounds_only
from aggregator.secure_round import ShareRebuilder, neighbour_graph
from aggregator.server_app import run_rounds
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.emulation.sources import SensorChange
from edge_client.wire import masking
from edge_client.wire.records import CONFIG
from edge_client.wire.run_config import RunSettings
from edge_client.wire.secagg_records import MASKED_INPUT, SHARE_KEYS, UNMASK
from tests.secagg_round import SECURE, Devices, Fast, assert_step, expected_step, one_round
from tests.secagg_round import config_of as _config

# -- the arithmetic -----------------------------------------------------------------------


def test_quantisation_is_unbiased_and_within_one_step_and_the_field_holds_the_sum() -> None:
    # Prepare: values inside and outside the range, 16-bit grid, 1,000 devices' worth
    rng = np.random.default_rng(0)
    values = rng.normal(0, 0.3, 20_000)
    step = 2 * 1.0 / (2**16 - 1)
    # Execute
    levels, clipped = masking.quantise(values, 1.0, 16, rng)
    back = masking.dequantise_sum(levels, 1, 1.0, 16)
    means = np.mean([masking.dequantise_sum(masking.quantise(np.full(1, 0.1234567), 1.0, 8,
                     rng)[0], 1, 1.0, 8)[0] for _ in range(4000)])  # fmt: skip
    # Assert: within one grid step where not clipped, clipped ones at the range, unbiased
    inside = np.abs(values) <= 1.0
    assert clipped == int((~inside).sum()) > 0
    assert np.max(np.abs(back[inside] - values[inside])) <= step + 1e-12
    assert np.allclose(back[~inside], np.sign(values[~inside]))
    assert means == pytest.approx(0.1234567, abs=2 * 2 / 255 / np.sqrt(4000) * 3)
    assert masking.field_bits(16, 1000) == 26 and (2**16 - 1) * 1000 < 2**26
    with pytest.raises(masking.MaskingError, match="64 at most"):
        masking.field_bits(48, 2**20)


def test_pairwise_masks_agreed_from_keys_cancel_in_the_sum_exactly() -> None:
    # Prepare: 5 devices, every pair's seed from X25519, inputs in a 20-bit field
    width, n, size = 20, 5, 1000
    rng = np.random.default_rng(1)
    keys = [masking.new_key_pair() for _ in range(n)]
    inputs = [rng.integers(0, 2**16, size).astype(np.uint64) for _ in range(n)]
    field_mask = np.uint64(2**width - 1)
    # Execute: each adds +mask for a higher-numbered peer, -mask for a lower one
    total = np.zeros(size, np.uint64)
    for u in range(n):
        y = inputs[u].copy()
        for v in range(n):
            if v != u:
                pair = masking.mask(masking.agree(keys[u][0], keys[v][1], "mask"), size, width)
                y = y + pair if u < v else y - pair
        total = (total + (y & field_mask)) & field_mask
        assert not np.array_equal(y & field_mask, inputs[u])
    # Assert
    assert np.array_equal(total, sum(inputs))


def test_shares_rebuild_a_secret_from_any_threshold_and_sealed_shares_are_authenticated() -> None:
    # Prepare
    secret = masking.new_seed()
    shares = masking.shares_of(secret, 4, 7)
    mine, theirs = masking.new_key_pair(), masking.new_key_pair()
    key = masking.agree(mine[0], theirs[1], "shares")
    # Execute
    sealed = masking.seal_share(key, 3, 9, shares[0], shares[1])
    tampered = sealed[:-3] + bytes([sealed[-3] ^ 1]) + sealed[-2:]
    # Assert
    assert masking.rebuild(shares[2:6]) == secret == masking.rebuild(shares[:4])
    assert _rebuilt_or_none(shares[:3]) != secret  # below the threshold: not the secret
    assert masking.open_share(masking.agree(theirs[0], mine[1], "shares"), sealed, 3, 9) == (
        shares[0],
        shares[1],
    )
    with pytest.raises(masking.MaskingError, match="failed authentication"):
        masking.open_share(key, tampered, 3, 9)
    with pytest.raises(masking.MaskingError, match="names nodes"):
        masking.open_share(key, sealed, 4, 9)


def _rebuilt_or_none(shares: list[bytes]) -> bytes | None:
    try:
        return masking.rebuild(shares)
    except masking.MaskingError:
        return None


def test_the_neighbour_graph_is_regular_symmetric_and_logarithmic() -> None:
    # Prepare / Execute
    sizes = {n: masking.neighbourhood_size(n, 0) for n in (4, 10, 100, 1000)}
    graph = neighbour_graph(1000, sizes[1000], random.Random(0))
    # Assert: all others in a small round, O(log n) in a large one, each edge both ways
    assert sizes == {4: 3, 10: 9, 100: 20, 1000: 30}
    assert all(len(near) == 30 for near in graph.values())
    assert all(i in graph[j] for i, near in graph.items() for j in near)
    assert masking.threshold_of(40, 0.6) == 24 and masking.threshold_of(3, 0.6) == 2
    assert masking.threshold_of(10, 0.5) == 6 == masking.threshold_of(11, 0.5)  # over half


# -- a round against the devices' own inputs ----------------------------------------------


def test_the_unmasked_sum_is_the_sum_of_the_devices_quantised_updates(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare
    app = Devices()
    # Execute
    session, step, report = one_round(tmp_path, fast, app)
    # Assert: every device's input in, and the step is exactly what their plain sum gives
    assert step is not None and len(app.inputs) == 6
    assert sorted(report.aggregated) == sorted(app.inputs)
    assert (report.secagg.survivors, report.secagg.dropped, report.secagg.skipped) == (6, 0, "")
    assert_step(step, expected_step(app, sorted(app.inputs), session, 5))


def test_the_aggregator_never_holds_a_single_devices_update(tmp_path: Path, fast: Fast) -> None:
    # Prepare
    app = Devices()
    # Execute
    _session, step, _report = one_round(tmp_path, fast, app)
    # Assert: no reply (all the aggregator receives) carries a device's input: the masked
    # vectors look uniform over the field and match no device's levels
    assert step is not None
    width = masking.field_bits(16, 6)
    masked = [
        np.frombuffer(_config(r)["masked"], "<u4").astype(np.uint64)
        for r in app.replies
        if r.has_content() and "masked" in r.content.config_records.get(CONFIG, {})
    ]
    assert len(masked) == 6
    for vector in masked:
        assert vector.mean() / 2**width == pytest.approx(0.5, abs=0.02)
        for levels in app.inputs.values():
            assert np.mean(vector == levels) < 0.01
            assert abs(np.corrcoef(vector.astype(float), levels.astype(float))[0, 1]) < 0.1
    # ... and no training reply carries an update frame
    frames = [
        r.content.config_records["update"]["frame"]
        for r in app.replies
        if r.has_content() and "update" in r.content.config_records
    ]
    assert frames and all(f == b"" for f in frames)


def test_devices_lost_before_and_after_their_masked_input_are_unmasked_from_shares(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: one device gone after sharing keys, one after its masked input
    app = Devices(drop={"dev-1": MASKED_INPUT, "dev-4": UNMASK})
    # Execute
    session, step, report = one_round(tmp_path, fast, app)
    # Assert: dev-4's input is in the sum (sent before it left), dev-1's is not; both lost
    survivors = [d for d in sorted(app.inputs) if d != "dev-1"]
    assert step is not None and sorted(report.aggregated) == survivors
    assert (report.secagg.survivors, report.secagg.dropped) == (5, 2)
    assert_step(step, expected_step(app, survivors, session, 5))


def test_below_the_minimum_of_survivors_the_round_is_skipped_and_the_model_kept(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: 4 devices, 2 lost at masked input, 3 needed
    app = Devices(drop={"dev-0": MASKED_INPUT, "dev-2": MASKED_INPUT})
    # Execute
    _session, step, report = one_round(tmp_path, fast, app, devices=4)
    # Assert
    assert step is None
    assert (report.secagg.skipped, report.secagg.survivors, report.secagg.dropped) == (
        "secagg-too-few",
        0,
        2,
    )


def _masked(reply: Message) -> bytes:
    return bytes(_config(reply)["masked"])


def _set_masked(reply: Message, data: bytes) -> Message:
    _config(reply)["masked"] = data
    return reply


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (lambda r: _set_masked(r, _masked(r)[:-4]), "secagg-masked-length"),
        (
            lambda r: _set_masked(r, b"\xff\xff\xff\xff" + _masked(r)[4:]),
            "secagg-out-of-field",
        ),
    ],
)
def test_a_masked_vector_of_the_wrong_length_or_outside_the_field_is_refused(
    tmp_path: Path, fast: Fast, bad: Callable[[Message], Message], reason: str
) -> None:
    # Prepare
    app = Devices(
        tamper={"dev-2": lambda stage, _msg, reply: bad(reply) if stage == MASKED_INPUT else reply}
    )
    # Execute
    session, step, report = one_round(tmp_path, fast, app)
    # Assert: refused and counted by reason; the others' sum, unmasked from dev-2's shares
    survivors = [d for d in sorted(app.inputs) if d != "dev-2"]
    assert report.refused == {"dev-2": reason}
    assert session.strategy.fleet.rejected_reasons == {reason: 1}
    assert step is not None and sorted(report.aggregated) == survivors
    assert_step(step, expected_step(app, survivors, session, 5))


def _flip_first_sealed(stage: str, msg: Message) -> Message:
    if stage == MASKED_INPUT:
        sealed = list(_config(msg)["sealed"])
        sealed[0] = sealed[0][:-5] + bytes([sealed[0][-5] ^ 1]) + sealed[0][-4:]
        _config(msg)["sealed"] = sealed
    return msg


def _reply_as_share_keys(stage: str, _msg: Message, reply: Message) -> Message:
    if stage == MASKED_INPUT:
        _config(reply)["secagg-stage"] = SHARE_KEYS
    return reply


def _ask_for_both(stage: str, msg: Message) -> Message:
    if stage == UNMASK:
        record = _config(msg)
        record["dropped"] = [*record["dropped"], record["survivors"][0]]
    return msg


@pytest.mark.parametrize(
    ("ask", "answer", "reason", "survives"),
    [
        (_flip_first_sealed, None, "secagg-share-auth", False),
        (None, _reply_as_share_keys, "secagg-wrong-stage", False),
        (_ask_for_both, None, "secagg-both-secrets", True),
    ],
)
def test_a_share_failing_authentication_a_wrong_stage_and_a_greedy_ask_are_refused(
    tmp_path: Path,
    fast: Fast,
    ask: Callable[[str, Message], Message] | None,
    answer: Callable[[str, Message, Message], Message] | None,
    reason: str,
    survives: bool,
) -> None:
    # Prepare: dev-3 gets a tampered share / answers as another stage / is asked for a
    # neighbour's seed and mask key both
    app = Devices(
        tamper_ask={"dev-3": ask} if ask else {}, tamper={"dev-3": answer} if answer else {}
    )
    # Execute
    session, step, report = one_round(tmp_path, fast, app)
    # Assert: refused, counted by reason, and the round still sums the right devices
    assert report.refused == {"dev-3": reason}
    assert session.strategy.fleet.rejected_reasons == {reason: 1}
    survivors = [d for d in sorted(app.inputs) if survives or d != "dev-3"]
    assert step is not None and sorted(report.aggregated) == survivors
    assert_step(step, expected_step(app, survivors, session, 5))


def test_a_tampered_share_at_unmasking_is_outvoted_not_unmasked_into_garbage(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: dev-0, the first to answer, sends corrupted seed shares (the others' shares
    # still rebuild the seeds)
    def corrupt(stage: str, _msg: Message, reply: Message) -> Message:
        if stage == UNMASK:
            record = _config(reply)
            record["seed-shares"] = [s[:4] + bytes(len(s) - 4) for s in record["seed-shares"]]
        return reply

    app = Devices(tamper={"dev-0": corrupt})
    # Execute
    session, step, _report = one_round(tmp_path, fast, app)
    # Assert
    assert step is not None
    assert_step(step, expected_step(app, sorted(app.inputs), session, 5))


def test_a_secret_is_rebuilt_only_when_it_matches_its_commitment() -> None:
    # Prepare: three shares of another secret come first, then four of the device's own
    secret, other = masking.new_seed(), masking.new_seed()
    shares = masking.shares_of(other, 3, 5)[:3] + masking.shares_of(secret, 3, 5)[:4]
    expected = masking.commitment(secret)
    # Execute
    rebuilt = masking.rebuild_checked(shares, 3, expected, "seed")
    # Assert: the subsets that rebuild the other secret are passed over; too few shares
    # or none that check out is None, never a wrong secret
    assert rebuilt == secret
    assert masking.rebuild_checked(shares[:2], 3, expected, "seed") is None
    assert masking.rebuild_checked(shares[:3], 3, expected, "seed") is None


def test_secrets_rebuilt_in_worker_processes_are_those_rebuilt_here() -> None:
    # Prepare: 40 seeds and mask keys (more than the pool's least), one with a bad share
    seeds = [masking.new_seed() for _ in range(40)]
    tasks = [(masking.shares_of(s, 4, 6), 4, masking.commitment(s), "seed") for s in seeds]
    key_seed = masking.new_seed()
    public = masking.public_of(masking.key_from_seed(key_seed))
    tasks.append((masking.shares_of(key_seed, 4, 6), 4, public, "key"))
    tasks[0][0][0] = tasks[0][0][0][:4] + bytes(16)  # a tampered share, outvoted
    rebuilder = ShareRebuilder(workers=2)
    # Execute
    try:
        pooled = rebuilder.rebuild(tasks)
    finally:
        rebuilder.close()
    # Assert
    assert pooled == [*seeds, key_seed]
    assert pooled == [masking.rebuild_checked(*task) for task in tasks]


def test_a_non_finite_update_is_caught_on_the_device_before_masking(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: one of 4 devices streams raw units a million times too large
    settings = fast(**SECURE, num_rounds=1, out_dir=str(tmp_path / "out"), lr=5.0)
    devices = [VirtualDevice(f"dev-{i}", rate=20_000) for i in range(3)]
    devices.append(VirtualDevice("dev-3", rate=20_000, change=SensorChange(0, gain=1e6)))
    grid = InProcessGrid(devices, tmp_path / "buffers", settings)
    # Execute
    try:
        records = rounds_only(run_rounds(grid, settings))
    finally:
        grid.close()
    # Assert: the diverged device sent no keys and no update; the other three are the sum
    (record,) = records
    assert record.rejected_reasons.get("diverged") == 1 and record.diverged == 1
    assert (record.secagg_survivors, record.secagg_dropped) == (3, 0)
    assert sorted(record.aggregated) == ["dev-0", "dev-1", "dev-2"]


# -- whole runs ---------------------------------------------------------------------------


def _run(tmp_path: Path, fast: Fast, name: str, **keys: Any) -> list[RoundRecord]:
    settings = fast(**{**SECURE, "out_dir": str(tmp_path / name), **keys})
    grid = InProcessGrid(
        [VirtualDevice(f"dev-{i}", rate=20_000) for i in range(6)],
        tmp_path / f"buffers-{name}",
        settings,
    )
    try:
        return rounds_only(run_rounds(grid, settings))
    finally:
        grid.close()


@pytest.mark.parametrize("aggregation", ["fednova", "fedavg"])
def test_a_secure_run_learns_what_the_plain_run_learns_within_a_point(
    tmp_path: Path, fast: Fast, aggregation: str
) -> None:
    # Prepare / Execute: the same seeded run, fixed batches, with and without masking
    plain = _run(tmp_path, fast, "plain", num_rounds=4, secure_aggregation=False,
                 aggregation=aggregation)  # fmt: skip
    secure = _run(tmp_path, fast, "secure", num_rounds=4, aggregation=aggregation)
    # Assert
    assert abs(secure[-1].test_accuracy - plain[-1].test_accuracy) <= 0.01
    assert [r.secagg_survivors for r in secure] == [6] * 4
    assert all(r.secagg_bytes_up > 0 and r.timing.secagg_s > 0 for r in secure)
    assert all(r.bytes_up == r.secagg_bytes_up for r in secure)  # no frame: all is stages
    logged = read_metrics(tmp_path / "secure" / "metrics.jsonl")
    assert [(r.secagg_survivors, r.secagg_dropped) for r in logged] == [(6, 0)] * 4
    assert all(r.secagg_survivors is None for r in plain)


def test_central_dp_noises_the_unmasked_sum(tmp_path: Path, fast: Fast) -> None:
    # Prepare / Execute: central DP with a clip and noise, under masking
    records = _run(tmp_path, fast, "dp", num_rounds=2, dp="central", dp_clip=0.5,
                   dp_noise=0.8)  # fmt: skip
    # Assert: each round masked, noised and accounted
    assert [r.secagg_survivors for r in records] == [6, 6]
    assert records[-1].dp_epsilon_spent is not None and records[-1].dp_epsilon_spent > 0
    assert all(r.dp_clip == 0.5 for r in records)


def test_the_noise_on_the_unmasked_sum_is_the_accounted_one(tmp_path: Path, fast: Fast) -> None:
    # Prepare: one secure round under central DP; the devices' own quantised inputs known
    clip, noise, devices = 0.5, 0.8, 6
    app = Devices()
    # Execute
    session, step, _report = one_round(
        tmp_path, fast, app, devices, dp="central", dp_clip=clip, dp_noise=noise
    )
    # Assert: the step less the devices' exact mean is Gaussian noise of the accounted
    # multiplier: standard deviation noise x clip over the expected count (here all 6)
    assert step is not None and len(app.inputs) == devices
    bits = session.settings.secure.secagg_bits
    total = np.asarray(sum(app.inputs.values()), np.uint64)
    exact = masking.dequantise_sum(total, devices, clip, bits)  # the range is the clip
    shapes = session.strategy.current_round.shapes
    residual = np.concatenate(
        [(step[k] - v / devices).ravel() for k, v in masking.unflatten(exact, shapes).items()]
    )
    assert residual.size > 5_000
    assert abs(residual.mean()) < 0.05 * noise * clip / devices
    assert residual.std() == pytest.approx(noise * clip / devices, rel=0.05)


@pytest.mark.parametrize(
    ("keys", "said"),
    [
        ({"mode": "async"}, "sync mode only"),
        ({"aggregation": "krum"}, "refuses aggregation = 'krum'"),
        ({"aggregation": "trimmed-mean"}, "robust rule looks at each update"),
        ({"compress": "topk"}, "top-k coordinates differ"),
        ({"compress": "adaptive"}, "top-k coordinates differ"),
        ({"compress": "int8"}, "own grid"),
        ({"drift_reaction": "boost"}, "drift-reaction = 'none'"),
        ({"inject_alpha": 0.2}, "refuses data injection"),
        ({"dp": "central", "dp_clip_quantile": 0.5}, "adaptive clipping"),
        ({"dp": "local"}, "biases the sum"),
        ({"secagg_threshold": 0.4}, "secagg-threshold must be"),
        ({"secagg_min_survivors": 1}, "secagg-min-survivors must be"),
        ({"secagg_bits": 60}, "secagg-bits must be"),
    ],
)
def test_what_cannot_combine_with_secure_aggregation_is_refused_in_one_line(
    keys: dict[str, object], said: str
) -> None:
    with pytest.raises(ValueError, match=said) as caught:
        RunSettings(**{"secure_aggregation": True, **keys})
    assert "\n" not in str(caught.value)
