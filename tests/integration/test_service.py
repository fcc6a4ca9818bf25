"""``fedstream serve`` against a real SuperLink (Flower's simulation engine, 2 virtual devices):
a continuous run stopped by SIGTERM after a whole round, exit 0, and resumed by the next
start with its rounds and model versions continuing."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from aggregator.checkpoint import read_state
from aggregator.round_log import read_metrics, rounds_only
from deploy.demo import APP_DIR
from deploy.flower import CONNECTION, FlowerDeployment
from deploy.local import ProcessGroup, fedstream_command, wait_until
from edge_client.wire.artifact import list_versions


@pytest.mark.timeout(300)  # two serves, each starting Ray: 1-2 minutes
def test_serve_stops_a_continuous_run_on_sigterm_and_the_next_start_resumes_it(
    tmp_path: Path,
) -> None:
    # Prepare: a simulation-mode SuperLink; serve's command line as a unit would run it.
    ckpt, out, exports = tmp_path / "ckpt", tmp_path / "out", tmp_path / "exports"
    metrics = out / "metrics.jsonl"
    config = (
        f"local-steps=2 controller-probe=0 out-dir='{out}' sim-dir='{tmp_path / 'sim'}' "
        f"export-dir='{exports}' export-every=1"
    )
    cmd = fedstream_command(
        "serve", "--app", str(APP_DIR), "--connection", CONNECTION,
        "--checkpoint-dir", str(ckpt), "--run-config", config,
    )  # fmt: skip
    with ProcessGroup() as group:
        flower = FlowerDeployment(group, tmp_path / "flwr", simulated_nodes=2)
        flower.start_superlink()
        log = tmp_path / "serve.log"

        def rounds() -> list[int]:
            return [r.round for r in rounds_only(read_metrics(metrics))]

        # Execute 1: serve until a round is in, then SIGTERM (systemctl stop).
        first = group.start("serve", cmd, log_path=log, env=flower.env)
        assert wait_until(lambda: len(rounds()) >= 1 or first.poll() is not None, 300), (
            log.read_text()
        )
        first.send_signal(signal.SIGTERM)
        rc = first.wait(timeout=300)
        # Assert 1: exit 0 after a whole round: checkpoint, metrics and export agree.
        assert rc == 0, log.read_text()[-3000:]
        last = read_state(ckpt)["server-round"]  # type: ignore[index]
        assert rounds() == list(range(1, last + 1))
        assert list_versions(exports)[-1].version == last

        # Execute 2: the unit starts again; one more round; SIGTERM.
        second = group.start("serve-2", cmd, log_path=log, env=flower.env)
        assert wait_until(lambda: len(rounds()) > last or second.poll() is not None, 300), (
            log.read_text()
        )
        second.send_signal(signal.SIGTERM)
        rc = second.wait(timeout=300)
        # Assert 2: it resumed: the rounds and the model versions go on without a gap.
        assert rc == 0, log.read_text()[-3000:]
        again = read_state(ckpt)["server-round"]  # type: ignore[index]
        assert again > last and rounds() == list(range(1, again + 1))
        assert list_versions(exports)[-1].version == again
        assert "resumed after round" in log.read_text()
