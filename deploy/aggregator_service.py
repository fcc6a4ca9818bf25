"""``fedstream serve``: the aggregator as a service (what ``fedstream-aggregator.service`` runs).

It keeps one continuous run (``num-rounds = 0``) going on a SuperLink:

1. if ``checkpoint-dir`` holds a checkpoint, the run is resumed from it (the checkpoint's run
   config, ``resume = true``), or followed if the run that wrote it is still going (this
   service restarted, not the run); otherwise a new run is submitted with the given run
   config, ``num-rounds = 0`` and that ``checkpoint-dir``;
2. it follows the run (``flwr list`` every :data:`POLL_S` seconds);
3. on SIGTERM, SIGINT or SIGHUP (``systemctl stop``, Ctrl-C, a closed terminal) it asks the
   run to stop after its current round (a ``STOP`` file in ``checkpoint-dir``: the
   ServerApp's process is the SuperLink's child, not ours), waits for the run to finish and exits 0;
4. if the run finishes by itself (it failed, or someone ran ``flwr stop``) it exits 1, and
   systemd's ``Restart=on-failure`` starts it again, which resumes from the checkpoint.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aggregator.checkpoint import read_state
from aggregator.stopping import request_stop
from deploy.flower import app_run_config, checkpoint_run, resume_run, run_status, submit_run
from edge_client.runtime.signals import set_on_signals

__all__ = ["POLL_S", "serve"]

log = logging.getLogger(__name__)

POLL_S = 10.0  # between `flwr list` calls (each is a Python process: about 1 CPU-second)


def serve(
    app_dir: Path,
    checkpoint_dir: Path,
    run_config: Mapping[str, Any],
    connection: str | None = None,
    env: Mapping[str, str] | None = None,
    stop_timeout: float = 3600.0,
    poll_s: float = POLL_S,
) -> int:
    """Run (or resume) the continuous run until a signal; the exit status.

    Parameters
    ----------
    app_dir : Path
        The Flower app (folder with ``pyproject.toml``).
    checkpoint_dir : Path
        The run's checkpoint directory (absolute on the SuperLink's host).
    run_config : Mapping
        Run-config overrides of a new run (ignored when resuming: the checkpoint's are used).
    connection : str, optional
        The SuperLink connection in ``$FLWR_HOME/config.toml``.
    env : Mapping, optional
        Extra environment for ``flwr`` (``FLWR_HOME``).
    stop_timeout : float
        Seconds to wait for the run to finish its round after a stop was asked.

    Returns
    -------
    int
        0 after a requested stop; 1 when the run ended by itself, or did not end in time.
    """
    checkpoint_dir = checkpoint_dir.resolve()

    def on_signal(signum: signal.Signals) -> None:
        log.info("%s: asking the run to stop after its current round", signum.name)

    with set_on_signals(on_signal=on_signal) as stopping:
        state = read_state(checkpoint_dir)
        live = None if state is None else checkpoint_run(state, connection, env)
        if live is not None:  # this service was restarted, not its run: follow the run
            run_id = live[0]
            log.info("run %s, which wrote the checkpoint, is still %s: following it", *live)
        elif state is not None:
            run_id, last, _ = resume_run(checkpoint_dir, app_dir, connection, env)
            log.info("resumed after round %d as run %s", last, run_id)
        else:
            config = {**run_config, "num-rounds": 0, "checkpoint-dir": str(checkpoint_dir)}
            run_id = submit_run(app_dir, connection, app_run_config(config, app_dir), env)
            log.info("started run %s (checkpoints in %s)", run_id, checkpoint_dir)
        while not stopping.wait(poll_s):
            status = str(run_status(run_id, connection, env).get("status", ""))
            if status.startswith("finished"):
                log.error("run %s ended by itself (%s): exiting to be restarted", run_id, status)
                return 1
        request_stop(checkpoint_dir)
        deadline = time.monotonic() + stop_timeout
        while time.monotonic() < deadline:
            status = str(run_status(run_id, connection, env).get("status", ""))
            if status.startswith("finished"):
                state = read_state(checkpoint_dir) or {}
                log.info(
                    "run %s stopped after round %s (%s)", run_id, state.get("server-round"), status
                )
                return 0
            time.sleep(min(poll_s, 2.0))
        log.error("run %s did not finish within %.0f s of the stop request", run_id, stop_timeout)
        return 1
