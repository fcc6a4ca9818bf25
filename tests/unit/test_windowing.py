"""Per-reading JSON, alignment, windows and late labels: the rules against hand-computed cases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.ingest import IngestConfig
from edge_client.runtime.mqtt import BrokerURL
from edge_client.runtime.schema import connect
from edge_client.runtime.windowing import (
    Aligner,
    LabelJoin,
    WindowAssembler,
    Windower,
    WindowSpec,
)
from edge_client.wire.constants import NO_LABEL
from edge_client.wire.frames import REJECT_REASONS, FrameError
from edge_client.wire.readings import ReadingFormat, decode_readings, parse_fields


def msg(topic: str, **reading: Any) -> tuple[str, bytes, float]:
    return (topic, json.dumps(reading).encode(), 0.0)


# -- per-reading JSON ----------------------------------------------------------------------


def test_field_paths_take_keys_nested_keys_indices_and_slices() -> None:
    # Prepare
    reading = {"ax": 1.0, "imu": {"acc": [2.0, 3.0, 4.0]}, "t": {"c": 5}}
    # Execute
    paths = parse_fields("ax, imu.acc[0:2], imu.acc[2], t.c")
    # Assert
    assert [p.text for p in paths] == ["ax", "imu.acc[0]", "imu.acc[1]", "imu.acc[2]", "t.c"]
    assert [p.get(reading) for p in paths] == [1.0, 2.0, 3.0, 4.0, 5]


@pytest.mark.parametrize("bad", ["", "a,,b", "a..b", ".a", "a.", "a[1:1]", "[0]", "a[x]", "a,a"])
def test_malformed_field_lists_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_fields(bad)


def fmt(**kw: Any) -> ReadingFormat:
    base: dict[str, Any] = {"fields": parse_fields("ax,ay")}
    return ReadingFormat(**(base | kw))


def test_readings_decode_one_or_a_list_in_the_declared_time_unit_or_iso_8601() -> None:
    # Prepare
    labelled = fmt(label_field=parse_fields("act")[0], classes=("walk", "run"), num_classes=2)
    one = json.dumps({"ts": 1_700_000_000_500, "ax": 1, "ay": 2.5, "act": "run"}).encode()
    many = json.dumps(
        [
            {"ts": "2023-11-14T22:13:20Z", "ax": 0, "ay": 0},
            {"ts": "2023-11-14T22:13:21", "ax": 1, "ay": 1},
        ]
    ).encode()
    # Execute
    (a,) = decode_readings(one, ReadingFormat(**{**labelled.__dict__, "time_unit": "ms"}))
    b, c = decode_readings(many, fmt())
    # Assert
    assert (a.ts, a.values, a.label) == (1_700_000_000.5, (1.0, 2.5), 1)
    assert (b.ts, c.ts, b.label) == (1_700_000_000.0, 1_700_000_001.0, None)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "empty"),
        (b"\xff{", "bad-utf8"),
        (b"{not json", "bad-json"),
        (b"[]", "empty"),
        (b"[1, 2]", "bad-json"),
        (b'{"ts": 1, "ax": 1}', "missing-field"),
        (b'{"ts": 1, "ax": 1, "ay": "x"}', "missing-field"),
        (b'{"ts": 1, "ax": 1, "ay": [1, 2]}', "missing-field"),
        (b'{"ts": 1, "ax": 1, "ay": 1e999}', "non-finite"),
        (b'{"ax": 1, "ay": 1}', "missing-field"),
        (b'{"ts": -1, "ax": 1, "ay": 1}', "bad-timestamp"),
        (b'{"ts": "yesterday", "ax": 1, "ay": 1}', "bad-timestamp"),
        (b'{"ts": true, "ax": 1, "ay": 1}', "bad-timestamp"),
        (b'{"ts": 1, "ax": 1, "ay": 1, "act": "swim"}', "unknown-label"),
        (b'{"ts": 1, "ax": 1, "ay": 1, "act": 7}', "bad-label"),
        (b'{"ts": 1, "ax": 1, "ay": 1, "act": null}', "bad-label"),
    ],
)
def test_bad_readings_are_refused_with_a_reason(payload: bytes, reason: str) -> None:
    labelled = fmt(label_field=parse_fields("act")[0], classes=("walk", "run"), num_classes=2)
    with pytest.raises(FrameError) as err:
        decode_readings(payload, labelled if b"act" in payload else fmt())
    assert err.value.reason == reason and reason in REJECT_REASONS


# -- windows -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "w", "s"), [(10, 5, 5), (12, 5, 2), (50, 8, 3), (30, 4, 7), (7, 7, 1), (6, 7, 1)]
)
def test_n_rows_make_floor_n_minus_w_over_s_plus_one_windows_in_order(
    n: int, w: int, s: int
) -> None:
    # Prepare
    windower = Windower(w, s)
    rows = [(float(i), (float(i), -float(i))) for i in range(n)]
    # Execute: one row at a time and all at once give the same
    one_by_one = [win for row in rows for win in windower.feed([row])]
    at_once = Windower(w, s).feed(list(rows))
    # Assert
    expected = (n - w) // s + 1 if n >= w else 0
    assert len(one_by_one) == len(at_once) == expected
    for k, (end, x) in enumerate(one_by_one):
        assert x.shape == (2, w)
        assert x[0].tolist() == list(range(k * s, k * s + w)) and end == k * s + w - 1


def test_a_break_restarts_the_windows_and_counts_the_readings_given_up() -> None:
    # Prepare
    windower = Windower(4, 2)
    rows: list[Any] = [(float(i), (float(i),)) for i in range(7)]
    rows += [None] + [(float(i), (float(i),)) for i in range(100, 105)]
    # Execute
    windows = windower.feed(rows)
    # Assert: 0-3, 2-5 before the break; 6 made no window (4 and 5 did); 100-103 after it
    assert [x[0].tolist() for _, x in windows] == [[0, 1, 2, 3], [2, 3, 4, 5], [100, 101, 102, 103]]
    assert windower.given_up == 1 and windower.waiting == 3


# -- alignment -----------------------------------------------------------------------------


def test_one_topic_passes_through_and_breaks_at_gaps() -> None:
    # Prepare
    aligner = Aligner((1,), rate=None, max_gap=0.5, max_skew=1.0)
    # Execute
    refused = [aligner.add(0, ts, (ts,)) for ts in (1.0, 1.1, 1.1, 1.05, 2.0, 2.1)]
    rows = aligner.rows()
    # Assert
    assert refused == [None, None, "duplicate", "late", None, None]
    assert rows == [(1.0, (1.0,)), (1.1, (1.1,)), None, (2.0, (2.0,)), (2.1, (2.1,))]


def test_two_topics_at_100_and_50_hz_are_interpolated_onto_one_50_hz_base() -> None:
    # Prepare: acc = 10 t (100 Hz, offset 5 ms), gyro = -t (50 Hz): linear, so exact
    aligner = Aligner((1, 1), rate=50.0, max_gap=0.1, max_skew=1.0)
    for i in range(101):
        t = 10.005 + i / 100
        assert aligner.add(0, t, (10 * t,)) is None
    for i in range(51):
        t = 10.0 + i / 50
        assert aligner.add(1, t, (-t,)) is None
    # Execute
    rows = aligner.rows()
    # Assert: ticks from 10.02 (the first after acc's first reading) to 11.0
    assert rows[0] is None  # 10.00 precedes acc's first reading
    ticks = [r for r in rows if r is not None]
    assert [round(t, 6) for t, _ in ticks] == [round(10 + k / 50, 6) for k in range(1, 51)]
    for t, (acc, gyro) in ticks:
        assert acc == pytest.approx(10 * t, abs=1e-9) and gyro == pytest.approx(-t, abs=1e-12)


def test_skew_within_the_tolerance_is_absorbed_beyond_it_refused() -> None:
    # Prepare: gyro arrives 0.5 s late (tolerance 1 s), then stalls 3 s (beyond it)
    aligner = Aligner((1, 1), rate=10.0, max_gap=0.25, max_skew=1.0)
    for i in range(10):
        aligner.add(0, 1.0 + i / 10, (1.0,))
    early = aligner.rows()
    for i in range(10):
        aligner.add(1, 1.0 + i / 10, (2.0,))
    # Execute
    absorbed = aligner.rows()
    for i in range(10, 40):
        aligner.add(0, 1.0 + i / 10, (1.0,))
    given_up = aligner.rows()
    late = [aligner.add(1, 2.0 + i / 10, (2.0,)) for i in range(5)]
    # Assert
    assert early == [] and len(absorbed) == 10 and None not in absorbed  # ticks 1.0 .. 1.9
    assert given_up[0] is None and given_up[1:] == []  # ticks without gyro: one break
    assert late == ["clock-skew"] * 5


# -- labels --------------------------------------------------------------------------------


def test_late_labels_are_joined_by_timestamp_and_missing_ones_time_out() -> None:
    # Prepare: labels hold from their time on; windows end at 1, 2, 3, 10
    join = LabelJoin(wait=5.0)
    for i, end in enumerate((1.0, 2.0, 3.0, 10.0)):
        join.hold(i, end)
    # Execute
    waiting = join.resolve(now=3.0, horizon=3.0)
    join.add(0.5, 0)  # walk from 0.5 s
    join.add(1.8, 1)  # run from 1.8 s
    join.add(2.5, 1)
    first = join.resolve(now=4.0, horizon=4.0)
    timed_out = join.resolve(now=15.5, horizon=15.5)  # 3.0 and 10.0 waited past 5 s
    # Assert
    assert waiting[0] == [] and not waiting[1]
    assert first[0] == [(0, 1.0, 0), (1, 2.0, 1)]
    assert timed_out[1] == [2, 3] and timed_out[2]["label-timeout"] == 2


def test_windows_before_any_label_are_unlabelled_and_old_labels_late() -> None:
    # Prepare
    join = LabelJoin(wait=10.0)
    join.hold(0, 1.0)
    join.add(2.0, 1)
    # Execute
    labelled, dropped, reasons = join.resolve(now=2.0, horizon=2.0)
    join.hold(1, 3.0)
    late = join.add(1.5, 0)  # before the label in force for every window still to come
    dup = join.add(2.0, 1)
    # Assert
    assert (labelled, dropped, reasons["unlabelled"]) == ([], [0], 1)
    assert (late, dup) == ("late", "duplicate")


# -- the assembler and its state -----------------------------------------------------------


def spec(**kw: Any) -> WindowSpec:
    base: dict[str, Any] = {"topics": ["s/imu"], "fields": "ax", "window": 4, "stride": 2}
    return WindowSpec.from_options(**(base | kw))


def test_label_free_windows_carry_no_label_and_bad_topics_are_counted() -> None:
    # Prepare
    assembler = WindowAssembler(spec())
    msgs = [msg("s/imu", ts=i, ax=i) for i in range(6)] + [msg("s/other", ts=9, ax=1)]
    # Execute
    made = assembler.feed(msgs)
    # Assert
    assert made.x.shape == (2, 1, 4) and made.y.tolist() == [NO_LABEL] * 2
    assert made.rejected == {"bad-topic": 1} and made.counts["readings"] == 6


def test_string_labels_outside_the_class_list_are_refused_and_counted() -> None:
    # Prepare
    assembler = WindowAssembler(spec(label_field="act", classes="walk,run", max_gap=5.0))
    acts = ["walk", "run", "swim", "run", "run", "walk"]
    # Execute
    made = assembler.feed([msg("s/imu", ts=i, ax=i, act=a) for i, a in enumerate(acts)])
    # Assert: "swim" is refused; readings 0, 1, 3, 4 make a window, labelled as its last
    assert made.rejected == {"unknown-label": 1}
    assert made.counts["readings"] == 5
    assert made.x[:, 0].tolist() == [[0, 1, 3, 4]] and made.y.tolist() == [1]


def test_a_restart_from_the_committed_state_makes_the_same_windows(tmp_path: Path) -> None:
    # Prepare: a label topic, labels 3 s behind the readings; commit half, reload, go on
    sp = spec(label_field="act", classes="a,b", label_topic="s/labels", max_gap=2.0)
    path = tmp_path / "buf.sqlite"
    readings = [msg("s/imu", ts=float(i), ax=float(i)) for i in range(20)]
    labels = [msg("s/labels", ts=float(i), act="ab"[i // 10]) for i in range(20)]
    lagging: list[tuple[str, bytes, float] | None] = [None, None, None, *labels]
    stream = [m for pair in zip(readings, lagging, strict=False) for m in pair if m]
    straight = WindowAssembler(sp).feed(stream)
    with BufferStore(path, shape=sp.shape) as store:
        first = WindowAssembler(sp)
        made = first.feed(stream[:17])
        store.append([], counts=made.counts, also=made.save)
    # Execute
    db = connect(path)
    second = WindowAssembler.load(sp, db)
    held = db.execute("SELECT count(*) FROM held_windows").fetchone()[0]
    db.close()
    rest = second.feed(stream[17:])
    # Assert: labels reach 16 s, so windows ending 3..15 s are out, 17 and 19 s wait
    assert held == len(made.hold) > 0
    assert np.concatenate([made.x, rest.x]).tolist() == straight.x.tolist()
    assert np.concatenate([made.y, rest.y]).tolist() == straight.y.tolist() == [0] * 4 + [1] * 3
    assert [h[1] for h in rest.hold] == [h[1] for h in straight.hold] == [17.0, 19.0]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"topics": ["a", "b"], "fields": "x"}, "--fields goes with one --topic"),
        ({"topics": ["a=x", "b=y"]}, "give --rate"),
        ({"topics": ["a"]}, "name each topic's channels"),
        ({"classes": "a,b"}, "need --label-field"),
        ({"label_field": "act"}, "need --classes"),
        ({"label_field": "act", "classes": "a,a"}, "distinct"),
        ({"window": 0}, "window and stride"),
        ({"max_gap": 0.0}, "max-gap"),
        ({"rate": 10.0, "max_gap": 0.05}, "shorter than one tick"),
        ({"time_unit": "h"}, "time unit"),
    ],
)
def test_window_specs_refuse_contradictions(kw: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"topics": ["s/imu"], "fields": "ax", "window": 4}
    if "topics" in kw and "fields" not in kw:
        base.pop("fields")
    with pytest.raises(ValueError, match=message):
        WindowSpec.from_options(**(base | kw))


def test_ingest_takes_its_shape_and_topics_from_the_window_spec() -> None:
    # Prepare
    sp = spec(topics=["a=ax,ay", "b=g[0:3]"], fields=None, rate=50.0, label_field="act",
              classes="x,y,z", label_topic="lab")  # fmt: skip
    # Execute
    config = IngestConfig(BrokerURL.parse("mqtt://h"), "dev", Path("b"), windowing=sp)
    # Assert
    assert config.shape == (5, 4) and config.num_classes == 3
    assert config.subscriptions == ("a", "b", "lab")
    with pytest.raises(ValueError, match="shape"):
        IngestConfig(BrokerURL.parse("mqtt://h"), "dev", Path("b"), shape=(3, 3), windowing=sp)


def test_a_restart_with_other_settings_starts_afresh_and_drops_what_waited(
    tmp_path: Path,
) -> None:
    # Prepare: a window waiting for its label, committed
    old = spec(label_field="act", classes="a,b", label_topic="s/labels")
    path = tmp_path / "buf.sqlite"
    with BufferStore(path, shape=old.shape) as store:
        made = WindowAssembler(old).feed([msg("s/imu", ts=float(i), ax=1.0) for i in range(5)])
        store.append([], counts=made.counts, also=made.save)
    # Execute: the same buffer, now windowed at another stride and rate
    new = spec(label_field="act", classes="a,b", label_topic="s/labels", rate=2.0)
    db = connect(path)
    again = WindowAssembler.load(new, db)
    db.close()
    with BufferStore(path) as store:
        step = again.feed([])
        store.append([], counts=step.counts, also=step.save)
        stats = store.stats()
    # Assert: the waiting window is dropped and counted, not left in the file
    assert len(made.hold) == 1 and again.next_id == 1
    assert stats["windows-held"] == 0
    assert stats["windows-dropped-by-reason"] == {"reconfigured": 1}


def test_labels_before_any_data_may_come_out_of_order() -> None:
    # Prepare: a tagger ahead of the sensor, its tags out of order
    join = LabelJoin(wait=10.0)
    # Execute
    refused = [join.add(5.0, 1), join.add(3.0, 0)]
    join.hold(0, 4.0)
    labelled, _, _ = join.resolve(now=6.0, horizon=4.0)
    # Assert: the window ending at 4 s takes the tag from 3 s
    assert refused == [None, None] and labelled == [(0, 4.0, 0)]


def test_inline_labels_survive_a_leading_topic_within_the_skew() -> None:
    # Prepare: labels on topic a, which runs 0.5 s ahead of b (skew allowed: 2 s)
    sp = spec(topics=["a=x", "b=y"], fields=None, rate=10.0, window=5, stride=5,
              label_field="act", classes="walk,run", max_gap=0.25)  # fmt: skip
    assembler = WindowAssembler(sp)
    stream = []
    for i in range(60):
        stream.append(msg("a", ts=100 + i / 10, x=1.0, act="walk" if i < 30 else "run"))
        if i >= 5:
            stream.append(msg("b", ts=100 + (i - 5) / 10, y=2.0))
    # Execute
    made = assembler.feed(stream)
    # Assert: ticks 100.0 .. 105.4 make 11 windows, each labelled by a's reading at its end
    ends = np.round(made.ts - 100, 3).tolist()
    assert ends == [round(0.4 + 0.5 * k, 3) for k in range(11)]
    assert made.y.tolist() == [0 if end < 3.0 else 1 for end in ends]
    assert not made.counts["windows-dropped:unlabelled"]


def test_a_long_gap_is_skipped_in_one_step_not_tick_by_tick() -> None:
    # Prepare: 100 Hz, then six hours of silence
    aligner = Aligner((1,), rate=100.0, max_gap=0.5, max_skew=1.0)
    for i in range(10):
        aligner.add(0, 1000.0 + i / 100, (1.0,))
    aligner.rows()
    # Execute
    aligner.add(0, 1000.09 + 6 * 3600, (2.0,))
    rows = aligner.rows()
    # Assert: one break, then the tick of the reading after the gap
    assert len(rows) == 2 and rows[0] is None and rows[1] is not None
    assert rows[1][0] == pytest.approx(1000.09 + 6 * 3600) and rows[1][1] == (2.0,)
    assert aligner.next_k == round((1000.09 + 6 * 3600) * 100) + 1


def test_a_reading_stamped_in_the_wrong_unit_is_refused_not_taken_as_the_clock() -> None:
    # Prepare: milliseconds where seconds are declared: 1.7e12 s, tens of millennia ahead
    assembler = WindowAssembler(spec(window=2, stride=2))
    now = 1_700_000_000.0
    stream = [("s/imu", json.dumps({"ts": now + i, "ax": i}).encode(), now + i) for i in range(2)]
    stream.insert(1, ("s/imu", json.dumps({"ts": now * 1000, "ax": 9}).encode(), now))
    # Execute
    made = assembler.feed(stream)
    # Assert: refused, and the readings after it still make their window
    assert made.rejected == {"bad-timestamp": 1} and made.x[:, 0].tolist() == [[0, 1]]


# -- readings that never arrived ------------------------------------------------------------


def test_at_a_declared_rate_holes_inside_a_stream_count_and_pauses_do_not() -> None:
    # Prepare: 100 Hz; 3 readings missing after 0.1 s, then a 5 s pause (max-gap 1 s)
    aligner = Aligner((1,), rate=100.0, max_gap=1.0, max_skew=1.0)
    stamps = [i / 100 for i in range(10)] + [0.13, 0.14] + [5.1 + i / 100 for i in range(3)]
    # Execute
    for ts in stamps:
        assert aligner.add(0, ts, (ts,)) is None
    # Assert: 0.10, 0.11, 0.12 are missing; the pause is a break, not a loss
    assert aligner.missing == 3


def test_a_topic_slower_than_the_grid_is_not_short_of_readings() -> None:
    # Prepare: a 25 Hz topic aligned with a 100 Hz one onto a 100 Hz grid
    aligner = Aligner((1, 1), rate=100.0, max_gap=1.0, max_skew=1.0)
    # Execute: every reading of both comes; then the slow one skips one reading
    for i in range(100):
        aligner.add(0, i / 100, (0.0,))
    for i in range(25):
        aligner.add(1, i / 25, (0.0,))
    whole = aligner.missing
    aligner.add(1, 27 / 25, (0.0,))  # 25/25 and 26/25 never came
    # Assert
    assert whole == 0 and aligner.missing == 2


def test_a_sensors_counter_counts_every_reading_that_never_came_across_restarts(
    tmp_path: Path,
) -> None:
    # Prepare: readings numbered by the sensor, no rate; 5..7 and 20..29 never come, the
    # sensor restarts its counter at 0 (not a loss), the daemon restarts from the file
    sp = spec(seq_field="n", max_gap=100.0)
    numbers = [*range(5), *range(8, 20), *range(30, 40)]
    stream = [msg("s/imu", ts=float(i), ax=float(i), n=n) for i, n in enumerate(numbers)]
    stream += [msg("s/imu", ts=100.0 + i, ax=1.0, n=i) for i in range(3)]  # counter restarted
    path = tmp_path / "buf.sqlite"
    with BufferStore(path, shape=sp.shape) as store:
        first = WindowAssembler(sp)
        made = first.feed(stream[:10])
        store.append([], counts=made.counts, also=made.save)
    # Execute
    db = connect(path)
    second = WindowAssembler.load(sp, db)
    db.close()
    rest = second.feed(stream[10:])
    # Assert: 3 + 10 missing, counted once, whichever process saw the gap
    assert made.counts["readings-missing"] + rest.counts["readings-missing"] == 13


def test_a_counter_that_is_not_a_whole_number_is_refused() -> None:
    fmt = ReadingFormat(parse_fields("ax"), seq_field=parse_fields("n")[0])
    for bad in (b'{"ts": 1, "ax": 1, "n": -1}', b'{"ts": 1, "ax": 1, "n": 1.5}'):
        with pytest.raises(FrameError) as err:
            decode_readings(bad, fmt)
        assert err.value.reason == "bad-sequence"
    assert decode_readings(b'{"ts": 1, "ax": 1, "n": 7}', fmt)[0].seq == 7
