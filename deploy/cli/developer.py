"""Commands of a developer: demo, bench, broker."""

from __future__ import annotations

import json
import logging
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from deploy.bench import SCENARIOS
from deploy.cli.common import console, fail, parse_run_config, require, setup_logging, stoppable
from deploy.cli.options import (
    POLICY_DEFAULT,
    PORT,
    POSITIVE,
    Policy,
    VerboseOption,
    run_help,
)
from deploy.constants import (
    DEFAULT_MQTT_PORT,
    DEMO_CAPACITY,
    DEMO_DEVICES,
    DEMO_DURATION_S,
    DEMO_MAX_DEVICES,
    DEMO_SETTINGS,
    SIMULATE_DEVICES,
)
from edge_client.runtime.constants import MQTT_311, MQTT_VERSION_ENV
from edge_client.wire.mapping import kebab

__all__ = ["bench", "broker", "demo", "simulate"]


def broker(
    port: Annotated[int, typer.Option(help="MQTT port.", click_type=PORT)] = DEFAULT_MQTT_PORT,
    listen: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
    verbose: VerboseOption = False,
) -> None:
    """Run the embedded MQTT broker (iotcore / rumqttd) in the foreground: MQTT 3.1.1 only
    (give its clients --mqtt-version 3.1.1, or FEDSTREAM_MQTT_VERSION=3.1.1)."""
    from deploy.brokers import run_embedded_broker

    setup_logging(verbose)
    require("fedstream broker", ("iotcore",))
    console.print(
        f"embedded MQTT broker on mqtt://{listen}:{port}, MQTT 3.1.1 only: give its clients "
        f"--mqtt-version {MQTT_311} (or {MQTT_VERSION_ENV}={MQTT_311}) (Ctrl+C stops it)"
    )
    try:
        with stoppable("the broker", normal_end=True):
            run_embedded_broker(port, listen)
    except OSError as err:
        raise fail(f"cannot listen on {listen}:{port}: {err}") from err


def demo(
    devices: Annotated[
        int | None,
        typer.Option(
            help=f"Number of devices (default: {DEMO_DEVICES}, or one per group with "
            "--partition-by).",
            min=1,
            max=DEMO_MAX_DEVICES,
        ),
    ] = None,
    rounds: Annotated[
        int | None,
        typer.Option(help=f"Federated rounds (num-rounds, default {DEMO_SETTINGS['num_rounds']})"),
    ] = None,
    controller: Annotated[
        str | None,
        typer.Option(help=run_help("controller", "Batch controller: fixed | static | dynamic.")),
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option(
            help=run_help(
                "mode",
                "sync rounds, or async (FedBuff: no device waits for the others; --rounds then "
                "counts model versions).",
            )
        ),
    ] = None,
    slowdowns: Annotated[
        str | None, typer.Option(help="Comma-separated slowdown per device (default 1,1,2,4).")
    ] = None,
    rates: Annotated[
        str | None, typer.Option(help="Comma-separated stream rate per device, samples/s.")
    ] = None,
    local_steps: Annotated[
        int | None,
        typer.Option(
            "--local-steps",
            help=f"Steps per round (local-steps, default {DEMO_SETTINGS['local_steps']})",
        ),
    ] = None,
    broker: Annotated[
        str | None, typer.Option(help="Use this broker instead of starting one.")
    ] = None,
    mosquitto: Annotated[
        bool, typer.Option("--mosquitto", help="Start Mosquitto instead of the embedded broker.")
    ] = False,
    capacity: Annotated[
        int, typer.Option(help="Buffer capacity per device.", min=1)
    ] = DEMO_CAPACITY,
    policy: Annotated[Policy, typer.Option(help="Buffer policy.")] = POLICY_DEFAULT,
    out: Annotated[Path, typer.Option(help="Where runs/<id>/ goes.")] = Path("runs"),
    live: Annotated[bool, typer.Option(help="Live table (off: one table per round).")] = True,
    agent: Annotated[
        bool,
        typer.Option(
            help="One fedstream agent per device: torch and the model loaded once, and it takes "
            "its SuperNode's tasks itself (no process per message). Off: Flower's way, a "
            "ClientApp process per message that loads torch itself."
        ),
    ] = True,
    stream_only: Annotated[
        bool, typer.Option("--stream-only", help="Only the streaming half (no training).")
    ] = False,
    duration: Annotated[
        float, typer.Option(help="Seconds of streaming (--stream-only).", click_type=POSITIVE)
    ] = DEMO_DURATION_S,
    kill: Annotated[
        list[str] | None, typer.Option(help="Fault injection: DEVICE@ROUND kills its SuperNode.")
    ] = None,
    restart: Annotated[
        list[str] | None,
        typer.Option(help="DEVICE@ROUND starts a killed device's SuperNode again."),
    ] = None,
    kill_agent: Annotated[
        list[str] | None,
        typer.Option(
            "--kill-agent",
            help="Fault injection: DEVICE@ROUND SIGKILLs the device's agent while it trains "
            "the next round, and starts it again (as systemd would).",
        ),
    ] = None,
    round_timeout: Annotated[
        float | None,
        typer.Option(
            "--round-timeout", help=run_help("round_timeout", "Seconds a round waits for devices.")
        ),
    ] = None,
    compress: Annotated[
        str | None,
        typer.Option(
            help=run_help(
                "compress", "Update codec: none | fp16 | int8 | topk | adaptive (ScaDLES)."
            )
        ),
    ] = None,
    compress_ratio: Annotated[
        float | None,
        typer.Option(
            "--compress-ratio", help=run_help("compress_ratio", "Top-k: fraction of values sent.")
        ),
    ] = None,
    compress_broadcast: Annotated[
        str | None,
        typer.Option(
            "--compress-broadcast",
            help=run_help("compress_broadcast", "Model sent down: none | fp16."),
        ),
    ] = None,
    labels: Annotated[
        int | None, typer.Option(help="Non-IID: K classes per device (round-robin).")
    ] = None,
    dirichlet: Annotated[
        float | None,
        typer.Option(help="Non-IID: Dirichlet(ALPHA) label mix per device.", click_type=POSITIVE),
    ] = None,
    inject_alpha: Annotated[
        float | None,
        typer.Option(
            "--inject-alpha",
            help=run_help("inject_alpha", "ScaDLES injection: fraction of devices sharing."),
        ),
    ] = None,
    inject_beta: Annotated[
        float | None,
        typer.Option(
            "--inject-beta",
            help=run_help("inject_beta", "... each shares this fraction of samples."),
        ),
    ] = None,
    proximal_mu: Annotated[
        float | None,
        typer.Option("--proximal-mu", help=run_help("proximal_mu", "FedProx term (0: FedAvg).")),
    ] = None,
    run_config: Annotated[
        str | None,
        typer.Option(
            "--run-config",
            help="Any other training setting, as for flwr run: 'key=value ...' "
            "(fedstream run-config lists the keys).",
        ),
    ] = None,
    kill_aggregator: Annotated[
        int | None,
        typer.Option(
            "--kill-aggregator",
            min=1,
            help="Fault injection: SIGKILL the SuperLink and ServerApp after this round, start "
            "the SuperLink again and resume the run from its last checkpoint.",
        ),
    ] = None,
    kill_broker: Annotated[
        int | None,
        typer.Option(
            "--kill-broker",
            min=1,
            help="Fault injection (with --mosquitto): SIGKILL the broker after this round and "
            "start it again 5 s later.",
        ),
    ] = None,
    source: Annotated[
        Path | None,
        typer.Option(
            help="Stream your own recording instead of the synthetic task: an .npz (arrays x "
            "and y) or .csv (label,f1,...) file, split across the devices; its sample shape "
            "and classes set the run's."
        ),
    ] = None,
    test: Annotated[
        Path | None,
        typer.Option(
            help="A test file of the recording (same form): the aggregator scores each round's "
            "model on it (test_accuracy in summary.json; per group too when it holds the "
            "--partition-by key)."
        ),
    ] = None,
    partition_by: Annotated[
        str | None,
        typer.Option(
            "--partition-by",
            help="One device per group of this key of --source (an .npz array or a .csv "
            "column, e.g. user), each streaming its group's samples in recorded order.",
        ),
    ] = None,
    partition: Annotated[
        str | None,
        typer.Option(
            help="Or split --source with Flower Datasets: iid, dirichlet(ALPHA), "
            "pathological(K) (default: natural with --partition-by, else shuffled)."
        ),
    ] = None,
    task: Annotated[
        str,
        typer.Option(
            help="classification, or forecast: --source is then a recorded series (.npz x of "
            "(T,) or (T, C), or a .csv with a column per channel), cut into windows of "
            "--window readings whose last forecast-horizon (--run-config) are predicted."
        ),
    ] = "classification",
    window: Annotated[
        int, typer.Option(help="--task forecast: readings per window (past + horizon).")
    ] = 32,
    style: Annotated[
        str,
        typer.Option(
            help="--task forecast: how the devices' sensors publish the series: json "
            "(fedstream's per-reading JSON), esphome (a bare value a channel topic), "
            "zigbee2mqtt (JSON without a timestamp), tasmota (a local time, UTC here) or "
            "sparkplug (Sparkplug B); each ingest daemon reads it with the options "
            "fedstream publish prints.",
        ),
    ] = "json",
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="Mosquitto with TLS, passwords and per-device ACL; Flower TLS and SuperNode "
            "authentication (keys registered). Everything generated under <run>/secrets.",
        ),
    ] = False,
) -> None:
    """Everything on one machine: streams, ingest, Flower SuperLink + SuperNodes, training."""
    from deploy.demo import DemoConfig, run_demo
    from deploy.flower import FlowerError

    setup_logging(False)
    logging.getLogger("iotcore").setLevel(logging.WARNING)  # the live table says it all
    # Training options are run-config keys: the demo's flags name the common ones.
    flags = {
        "num_rounds": rounds,
        "local_steps": local_steps,
        "controller": controller,
        "mode": mode,
        "round_timeout": round_timeout,
        "compress": compress,
        "compress_ratio": compress_ratio,
        "compress_broadcast": compress_broadcast,
        "inject_alpha": inject_alpha,
        "inject_beta": inject_beta,
        "proximal_mu": proximal_mu,
    }
    try:
        overrides = parse_run_config(run_config)
        overrides.update({kebab(k): v for k, v in flags.items() if v is not None})
        config = DemoConfig(
            devices=devices if devices is not None else (0 if partition_by else DEMO_DEVICES),
            duration=duration,
            rates=[float(r) for r in rates.split(",")] if rates else None,
            broker=broker,
            mosquitto=mosquitto,
            capacity=capacity,
            policy=policy.value,
            out=out,
            live=live,
            slowdowns=[float(s) for s in slowdowns.split(",")] if slowdowns else None,
            stream_only=stream_only,
            run_config=overrides,
            kill=_parse_kills(kill or []),
            restart=_parse_kills(restart or [], "--restart"),
            kill_agent=_parse_kills(kill_agent or [], "--kill-agent"),
            labels=labels,
            dirichlet=dirichlet,
            secure=secure,
            agent=agent,
            kill_aggregator=kill_aggregator,
            kill_broker=kill_broker,
            source=source,
            test=test,
            partition_by=partition_by,
            partition=partition,
            task=task,
            window=window,
            style=style,
        )
    except ValueError as err:
        raise fail(str(err)) from err
    own_broker = not (config.broker or config.mosquitto or config.secure)
    require("fedstream demo", ("matplotlib", "iotcore") if own_broker else ("matplotlib",))
    try:
        with stoppable("the demo"):
            ok = run_demo(config, console=Console())
    except FlowerError as err:
        raise fail(str(err)) from err
    raise typer.Exit(0 if ok else 1)


def simulate(
    devices: Annotated[
        int | None,
        typer.Option(
            help="Virtual devices (default: the recording's groups with --partition-by, else "
            f"{SIMULATE_DEVICES}).",
            min=1,
        ),
    ] = None,
    rounds: Annotated[
        int | None, typer.Option(help=run_help("num_rounds", "Federated rounds."), min=1)
    ] = None,
    run_config: Annotated[
        str | None,
        typer.Option(
            "--run-config",
            help="Any other setting, as for flwr run: 'key=value ...' (fedstream run-config "
            "lists the keys; sim-* shape the virtual devices).",
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option(help="The folder the run's sim-<time>/ is written in.")
    ] = Path("runs"),
    source: Annotated[
        Path | None,
        typer.Option(
            help="A recording the devices stream: .npz (arrays x, y and the --partition-by "
            "key) or .csv (label,f1,... and a named key column); default: the synthetic task."
        ),
    ] = None,
    partition_by: Annotated[
        str | None,
        typer.Option(
            "--partition-by",
            help="One device per group of this key of the recording (e.g. user), each "
            "streaming its group's samples in recorded order.",
        ),
    ] = None,
    partition: Annotated[
        str | None,
        typer.Option(
            help="Or split it with Flower Datasets: iid, dirichlet(ALPHA), pathological(K) "
            "(default: natural with --partition-by, else iid)."
        ),
    ] = None,
    test: Annotated[
        Path | None,
        typer.Option(
            help="A held-out file the aggregator scores every round's model on (per group too "
            "when it holds the --partition-by key)."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seeds the split, the model and the draws.")] = 0,
    live: Annotated[bool, typer.Option(help="Live table (off: one table per round).")] = True,
) -> None:
    """A federation on Flower's simulation engine: virtual devices streaming the synthetic task
    or your recording (one device per person with --partition-by), the same summary.json,
    metrics.jsonl and report as the demo."""
    from deploy.flower import FlowerError
    from deploy.simulate import SimulateConfig, run_simulation

    setup_logging(False)
    require("fedstream simulate", ("ray", "flwr_datasets", "matplotlib"))
    try:
        config = SimulateConfig(
            devices=devices,
            rounds=rounds,
            run_config=parse_run_config(run_config),
            out=out,
            source=source,
            partition_by=partition_by,
            partition=partition,
            test=test,
            seed=seed,
            live=live,
        )
        with stoppable("the simulation"):
            ok = run_simulation(config, console=Console())
    except (ValueError, FlowerError) as err:
        raise fail(str(err)) from err
    raise typer.Exit(0 if ok else 1)


Scenario = Enum("Scenario", {n: n for n in [*SCENARIOS, "all"]}, type=str)  # type: ignore[misc]


def bench(
    scenario: Annotated[Scenario, typer.Argument(help="What to measure ('all': every one).")],
    quick: Annotated[bool, typer.Option("--quick", help="Shorter runs (a smoke test).")] = False,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the JSON results here.")
    ] = None,
    out: Annotated[Path, typer.Option(help="Where <scenario>.json/.md/.png go.")] = Path(
        "bench/results"
    ),
) -> None:
    """Benchmarks: tables, plots and JSON (on the in-process runner's virtual clock; deployment:
    real Flower processes on the wall clock)."""
    setup_logging(False)
    require("fedstream bench")
    names = list(SCENARIOS) if scenario.value == "all" else [scenario.value]
    combined: dict[str, object] = {}
    with stoppable(f"bench {scenario.value}"):
        _run_benches(names, quick, out, json_path if scenario.value != "all" else None, combined)
    if json_path is not None and scenario.value == "all":
        json_path.write_text(json.dumps(combined, indent=2) + "\n")


def _run_benches(
    names: list[str], quick: bool, out: Path, json_path: Path | None, combined: dict[str, object]
) -> None:
    """Run the benchmarks ``names`` one after another, each result into ``combined``."""
    from deploy.bench import run_scenario

    for name in names:
        console.print(f"[bold]bench {name}[/bold]{' (quick)' if quick else ''}")
        result, paths = run_scenario(name, quick, out, json_path)
        print(result.table, flush=True)
        console.print("wrote " + ", ".join(str(p) for p in paths))
        combined[name] = json.loads((out / f"{name}.json").read_text())


def _parse_kills(specs: list[str], option: str = "--kill") -> dict[str, int]:
    out: dict[str, int] = {}
    for spec in specs:
        dev, sep, after = spec.partition("@")
        if not sep or not after.isdigit():
            raise ValueError(f"{option} takes DEVICE@ROUND, got {spec!r}")
        out[dev] = int(after)
    return out
