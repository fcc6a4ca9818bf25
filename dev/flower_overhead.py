"""Per-round orchestration cost of Flower's deployment engine on this machine.

    python dev/flower_overhead.py [--rounds 6] [--nodes 4] --json /tmp/flower_overhead.json

What it measures: the wall time of one federated round when Flower itself does the work
that fedstream's virtual-clock benchmark does not model, so that the benchmark can charge
"a round costs compute + this overhead". A real deployment runs on 127.0.0.1, started the
way ``fedstream`` starts one (:class:`deploy.flower.FlowerDeployment`): one insecure
``flower-superlink`` and ``--nodes`` ``flower-supernode`` processes, both with
``--isolation subprocess``, and ``flwr run`` against the SuperLink (the deployment engine,
not the simulation engine).

The app is plain Flower, no fedstream code; it is written to a scratch folder at run time.
Its ServerApp runs Flower's own ``flwr.serverapp.strategy.FedAvg`` (``strategy.start``)
over every SuperNode, train only (``fraction_evaluate=0``: one message exchange per round,
like a fedstream round). Its ClientApp imports torch, builds the model, loads the arrays it
was sent, does one forward pass on 32 random rows and sends the arrays back. The work is
trivial on purpose: what is left of the round is orchestration.

It runs twice on the same deployment, once per model size: ``tiny`` (an MLP of ~6k float32
parameters, 23 KB) and ``1M`` (~1M parameters, 4 MB), so that the per-MB cost of sending
the model down and back up shows as the difference of the two medians.

Per round (rounds 2..N; round 1 is warm-up) it reports the wall time from FedAvg's
``configure_train`` to the end of ``aggregate_train`` (median, min, max), and where the
time goes, from timestamps the ServerApp and every ClientApp process append to a trace
file:

- ``ready``: round start to the last ClientApp handler's end (the critical path before
  the replies travel back);
- ``dispatch``: round start to the last ClientApp process being started (the SuperNode
  pulling the message, its SuperExec launching the process);
- ``startup``: process start to the handler, i.e. ``flwr_start`` (Python and flwr starting,
  pulling the message and the FAB) then ``torch_import``;
- ``handler``: the ClientApp function (load the arrays, one forward pass, serialize);
- ``return``: last handler end to the ServerApp holding every reply (the reply's way back
  and the ServerApp's polling);
- on the ServerApp's side ``push_s`` (``Grid.push_messages``), ``pull_s`` (the
  ``Grid.pull_messages`` calls that brought replies) and ``polls`` (``pull_messages`` calls
  in the round: ``send_and_receive`` sleeps 3 s between them, so ``wall`` comes in steps of
  about 3 s while ``ready`` does not).

``per_mb_s`` is the difference of the two sizes' median ``wall`` per MB of model
(``per_mb_mean_s`` of their means, ``per_mb_ready_s`` of their median ``ready``); the model
crosses the network down and back up once per node and round.

Every process started is stopped by pid (:class:`deploy.local.ProcessGroup`); every wait is
bounded. Needs ``flwr`` 1.42 and torch; runs in about three minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deploy.flower import FlowerDeployment

REPO = Path(__file__).resolve().parents[1]
IN_FEATURES = 64
OUT_FEATURES = 6
SIZES = {"tiny": 6_000, "1M": 1_000_000}  # target parameter counts
RUN_TIMEOUT_S = 60.0  # per run, plus ROUND_TIMEOUT_S per round
ROUND_TIMEOUT_S = 45.0
STALL_CHECK_S = 30.0  # ask `flwr list` about the run only after this long without progress

APP_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "flower-overhead"
version = "1.0.0"
description = "Plain Flower FedAvg app for dev/flower_overhead.py"
license = "Apache-2.0"
dependencies = ["flwr>=1.42", "torch"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedstream-dev"

[tool.flwr.app.components]
serverapp = "overhead_app:server"
clientapp = "overhead_app:client"

[tool.flwr.app.config]
num-rounds = 6
num-nodes = 4
hidden = 48
trace-file = ""
"""

APP_SOURCE = '''\
"""Plain Flower app: FedAvg over every SuperNode; the ClientApp does one forward pass."""

import json
import os
import time

T_MODULE = time.time()  # the ClientApp process imports this module once per message

import torch  # noqa: E402

T_TORCH = time.time()

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402


def process_start_time():
    """Wall-clock time this process started (from /proc, 10 ms resolution)."""
    with open("/proc/self/stat") as fh:
        ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as fh:
        uptime = float(fh.read().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def trace(path, record):
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\\n")


def build(hidden):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 6),
    )


class TimedFedAvg(FedAvg):
    """FedAvg that appends each round's timestamps to the trace file."""

    def __init__(self, trace_file, **kwargs):
        super().__init__(**kwargs)
        self.trace_file = trace_file
        self.started = {}

    def configure_train(self, server_round, arrays, config, grid):
        t_start = time.time()
        self.grid_calls.clear()  # drops the empty evaluate exchange's pull
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self.started[server_round] = (t_start, time.time())
        return messages

    def aggregate_train(self, server_round, replies):
        t_replies = time.time()
        replies = list(replies)
        result = super().aggregate_train(server_round, replies)
        t_start, t_configured = self.started[server_round]
        calls = self.grid_calls
        trace(
            self.trace_file,
            {
                "kind": "round",
                "round": server_round,
                "t_start": t_start,
                "t_configured": t_configured,
                "t_replies": t_replies,
                "t_end": time.time(),
                "replies": len(replies),
                "errors": sum(1 for m in replies if m.has_error()),
                "push_s": sum(d for name, d, _ in calls if name == "push"),
                "pulls": sum(1 for name, _, _ in calls if name == "pull"),
                "pull_s": sum(d for name, d, n in calls if name == "pull" and n),
            },
        )
        return result

    def watch(self, grid):
        """Time the grid's push_messages and pull_messages (send_and_receive calls them)."""
        self.grid_calls = []

        def timed(name, fn):
            def call(*args, **kwargs):
                t0 = time.time()
                out = list(fn(*args, **kwargs))
                self.grid_calls.append((name, time.time() - t0, len(out)))
                return out

            return call

        grid.push_messages = timed("push", grid.push_messages)
        grid.pull_messages = timed("pull", grid.pull_messages)


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    trace_file = str(cfg["trace-file"])
    nodes = int(cfg["num-nodes"])
    model = build(int(cfg["hidden"]))
    trace(trace_file, {"kind": "serverapp", "t": time.time(), "pid": os.getpid()})
    strategy = TimedFedAvg(
        trace_file,
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=nodes,
        min_evaluate_nodes=0,
        min_available_nodes=nodes,
    )
    strategy.watch(grid)
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(cfg["num-rounds"]),
        timeout=120.0,
    )
    trace(trace_file, {"kind": "done", "t": time.time()})


client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    t_handler = time.time()
    torch.set_num_threads(1)
    model = build(int(context.run_config["hidden"]))
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    with torch.no_grad():
        model(torch.randn(32, 64))
    content = RecordDict(
        {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"num-examples": 1}),
        }
    )
    trace(
        str(context.run_config["trace-file"]),
        {
            "kind": "client",
            "round": int(msg.content["config"]["server-round"]),
            "node": context.node_id,
            "pid": os.getpid(),
            "t_process": process_start_time(),
            "t_module": T_MODULE,
            "t_torch": T_TORCH,
            "t_handler": t_handler,
            "t_handler_end": time.time(),
        },
    )
    return Message(content=content, reply_to=msg)
'''


def hidden_for(params: int) -> int:
    """Hidden width of the app's MLP (64-h-h-6) whose parameter count is nearest ``params``.

    Parameters
    ----------
    params : int
        Target number of parameters.

    Returns
    -------
    int
        The width ``h``; the MLP has ``h*h + 72*h + 6`` parameters.
    """
    return min(range(1, 4096), key=lambda h: abs(param_count(h) - params))


def param_count(hidden: int) -> int:
    """Parameters of the app's MLP ``64 -> hidden -> hidden -> 6`` (weights and biases).

    Parameters
    ----------
    hidden : int
        Hidden width.

    Returns
    -------
    int
        Number of float32 parameters.
    """
    return (IN_FEATURES + 1) * hidden + (hidden + 1) * hidden + (hidden + 1) * OUT_FEATURES


def write_app(folder: Path) -> Path:
    """Write the plain Flower app (``pyproject.toml`` and ``overhead_app.py``) to ``folder``.

    Parameters
    ----------
    folder : Path
        Where the app goes (created).

    Returns
    -------
    Path
        ``folder``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(APP_PYPROJECT)
    (folder / "overhead_app.py").write_text(APP_SOURCE)
    return folder


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The trace file's records (complete lines only).

    Parameters
    ----------
    path : Path
        The trace file (JSON lines).

    Returns
    -------
    list of dict
        One record per complete line; empty if there is no file yet.
    """
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written
    return records


def spread(values: list[float]) -> dict[str, float]:
    """Median, min, max and mean of ``values`` (seconds), rounded to milliseconds.

    Parameters
    ----------
    values : list of float
        The samples; must not be empty.

    Returns
    -------
    dict
        ``median``, ``min``, ``max``, ``mean``.
    """
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "mean": round(statistics.fmean(values), 3),
    }


def summarize(records: list[dict[str, Any]], t_submit: float) -> dict[str, Any]:
    """Per-round wall times and their breakdown, from one run's trace.

    Parameters
    ----------
    records : list of dict
        The run's trace records (``round``, ``client``, ``serverapp``, ``done``).
    t_submit : float
        Wall-clock time ``flwr run`` was called.

    Returns
    -------
    dict
        ``rounds`` (one entry per round, in seconds), ``steady`` (the spread of each
        quantity over rounds 2..N), ``first_round_s``, ``run_startup_s`` (``flwr run`` to
        the first round's start), ``clientapp_processes`` and ``messages``.
    """
    rounds = sorted((r for r in records if r["kind"] == "round"), key=lambda r: r["round"])
    clients = [r for r in records if r["kind"] == "client"]
    per_round = []
    for rnd in rounds:
        mine = [c for c in clients if c["round"] == rnd["round"]]
        entry: dict[str, Any] = {
            "round": rnd["round"],
            "wall_s": rnd["t_end"] - rnd["t_start"],
            "replies": rnd["replies"],
            "errors": rnd["errors"],
        }
        if mine:
            last_end = max(c["t_handler_end"] for c in mine)
            entry |= {
                "ready_s": last_end - rnd["t_start"],
                "dispatch_s": max(c["t_process"] for c in mine) - rnd["t_start"],
                "startup_s": statistics.median(c["t_handler"] - c["t_process"] for c in mine),
                "flwr_start_s": statistics.median(c["t_module"] - c["t_process"] for c in mine),
                "torch_import_s": statistics.median(c["t_torch"] - c["t_module"] for c in mine),
                "handler_s": statistics.median(c["t_handler_end"] - c["t_handler"] for c in mine),
                "return_s": rnd["t_replies"] - last_end,
            }
        if "push_s" in rnd:
            entry |= {"push_s": rnd["push_s"], "pull_s": rnd["pull_s"], "polls": rnd["pulls"]}
        per_round.append(entry)
    steady = [e for e in per_round if e["round"] >= 2] or per_round
    keys = ["wall_s", "ready_s", "dispatch_s", "startup_s", "flwr_start_s", "torch_import_s"]
    keys += ["handler_s", "return_s", "push_s", "pull_s", "polls"]
    return {
        "rounds": [
            {k: round(v, 3) if isinstance(v, float) else v for k, v in e.items()} for e in per_round
        ],
        "steady": {k: spread([e[k] for e in steady if k in e]) for k in keys if k in steady[0]},
        "first_round_s": round(per_round[0]["wall_s"], 3) if per_round else None,
        "run_startup_s": round(rounds[0]["t_start"] - t_submit, 3) if rounds else None,
        "clientapp_processes": len({c["pid"] for c in clients}),
        "messages": len(clients),
    }


def run_once(
    flower: FlowerDeployment, app: Path, trace_file: Path, hidden: int, rounds: int, nodes: int
) -> dict[str, Any]:
    """Submit one run of the app and wait (bounded) until it has finished.

    Parameters
    ----------
    flower : FlowerDeployment
        The running SuperLink and SuperNodes.
    app : Path
        The app folder.
    trace_file : Path
        Where the app appends its timestamps (must not exist yet).
    hidden : int
        The MLP's hidden width.
    rounds, nodes : int
        Rounds, and SuperNodes each round waits for.

    Returns
    -------
    dict
        :func:`summarize`'s result plus ``run_id`` and ``status``.

    Raises
    ------
    RuntimeError
        If the run fails or does not finish in time.
    """
    t_submit = time.time()
    run_id = flower.submit(
        app,
        {
            "num-rounds": rounds,
            "num-nodes": nodes,
            "hidden": hidden,
            "trace-file": str(trace_file),
        },
    )
    deadline = time.monotonic() + RUN_TIMEOUT_S + rounds * ROUND_TIMEOUT_S
    seen, last_progress = 0, time.monotonic()
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        records = read_trace(trace_file)
        if any(r["kind"] == "done" for r in records):
            break
        if len(records) != seen:
            seen, last_progress = len(records), time.monotonic()
        elif time.monotonic() - last_progress > STALL_CHECK_S:
            # `flwr list` costs a CPU-second: asked only when the trace stalls
            status = flower.status(run_id)
            if str(status.get("status", "")).startswith("finished"):
                raise RuntimeError(f"run {run_id} ended early: {status}")
            last_progress = time.monotonic()
        time.sleep(0.2)
    else:
        raise RuntimeError(f"run {run_id} did not finish in time: {flower.status(run_id)}")
    for _ in range(100):  # the ServerApp process exits after "done": wait up to ~30 s
        status = flower.status(run_id)
        if str(status.get("status", "")).startswith("finished"):
            break
        time.sleep(0.3)
    result = summarize(read_trace(trace_file), t_submit)
    return {"run_id": run_id, "status": status.get("status"), **result}


def measure(rounds: int, nodes: int, workdir: Path) -> dict[str, Any]:
    """Start the deployment, run the app once per model size, stop everything.

    Parameters
    ----------
    rounds : int
        Rounds per run.
    nodes : int
        SuperNodes.
    workdir : Path
        Scratch folder (the app, ``FLWR_HOME``, logs, traces).

    Returns
    -------
    dict
        Versions, settings, and per model size its parameters and :func:`run_once` result.
    """
    sys.path.insert(0, str(REPO))
    import flwr
    import torch

    from deploy.flower import FlowerDeployment
    from deploy.local import ProcessGroup

    app = write_app(workdir / "app")
    out: dict[str, Any] = {
        "flwr": flwr.__version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "nodes": nodes,
        "rounds": rounds,
        "isolation": "subprocess",
        "round_definition": "FedAvg configure_train start to aggregate_train end, train only",
        "steady_rounds": f"2..{rounds}",
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),  # other work on the machine skews the numbers
        "sizes": {},
    }
    with ProcessGroup(grace=5.0) as group:
        flower = FlowerDeployment(group, workdir / "flwr")
        t0 = time.monotonic()
        flower.start_superlink()
        for i in range(nodes):
            flower.start_supernode(f"n{i}", {"device-id": f"n{i}"})
        flower.wait_nodes(nodes, timeout=90.0)
        out["deployment_startup_s"] = round(time.monotonic() - t0, 3)
        for label, target in SIZES.items():
            hidden = hidden_for(target)
            params = param_count(hidden)
            result = run_once(flower, app, workdir / f"trace-{label}.jsonl", hidden, rounds, nodes)
            out["sizes"][label] = {
                "hidden": hidden,
                "params": params,
                "model_mb": round(params * 4 / 1e6, 3),
                **result,
            }
            print(f"{label}: done ({result['status']})", file=sys.stderr)
    out["loadavg_end"] = os.getloadavg()
    tiny, big = out["sizes"]["tiny"], out["sizes"]["1M"]
    extra_mb = big["model_mb"] - tiny["model_mb"]
    delta = big["steady"]["wall_s"]["median"] - tiny["steady"]["wall_s"]["median"]
    out["per_mb_s"] = round(delta / extra_mb, 4)  # per MB of model (sent down and back up)
    delta_mean = big["steady"]["wall_s"]["mean"] - tiny["steady"]["wall_s"]["mean"]
    out["per_mb_mean_s"] = round(delta_mean / extra_mb, 4)
    delta_ready = big["steady"]["ready_s"]["median"] - tiny["steady"]["ready_s"]["median"]
    out["per_mb_ready_s"] = round(delta_ready / extra_mb, 4)
    return out


def print_table(result: dict[str, Any]) -> None:
    """Print the per-round spread and breakdown per model size.

    Parameters
    ----------
    result : dict
        :func:`measure`'s result.
    """
    print(
        f"Flower {result['flwr']}, {result['nodes']} SuperNodes (--isolation subprocess), "
        f"{result['rounds']} rounds; seconds over rounds {result['steady_rounds']}"
    )
    load = ", ".join(f"{x:.1f}" for x in result["loadavg_start"])
    print(
        f"deployment startup {result['deployment_startup_s']:.1f} s; load average at start "
        f"{load} on {result['cpus']} CPUs"
    )
    header = f"{'model':>6} {'params':>9} {'MB':>6} {'quantity':>15} {'median':>7} "
    print(header + f"{'min':>7} {'max':>7}")
    for label, size in result["sizes"].items():
        for i, (key, s) in enumerate(size["steady"].items()):
            lead = f"{label:>6} {size['params']:>9} {size['model_mb']:>6.2f}" if i == 0 else ""
            print(f"{lead:>23} {key:>15} {s['median']:>7.2f} {s['min']:>7.2f} {s['max']:>7.2f}")
        print(
            f"{'':>23} round 1 {size['first_round_s']:.2f} s, flwr run -> round 1 "
            f"{size['run_startup_s']:.2f} s, {size['clientapp_processes']} ClientApp "
            f"processes for {size['messages']} messages"
        )
    print(
        f"per MB of model: {result['per_mb_s']:.3f} s (medians), "
        f"{result['per_mb_mean_s']:.3f} s (means), {result['per_mb_ready_s']:.3f} s (ready)"
    )


def main(argv: list[str] | None = None) -> int:
    """Command line: measure, print the table, write the JSON.

    Parameters
    ----------
    argv : list of str, optional
        Arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit status.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per run (default 6)")
    parser.add_argument("--nodes", type=int, default=4, help="SuperNodes (default 4)")
    parser.add_argument("--json", type=Path, required=True, help="where the JSON goes")
    parser.add_argument(
        "--keep", type=Path, default=None, help="scratch folder to keep (default: a temp one)"
    )
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.nodes < 1:
        parser.error("need --rounds >= 2 and --nodes >= 1")
    if args.keep is not None:
        result = measure(args.rounds, args.nodes, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="flower-overhead-") as tmp:
            result = measure(args.rounds, args.nodes, Path(tmp))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
