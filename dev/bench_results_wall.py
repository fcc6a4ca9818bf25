"""The ``## Results`` bullets of the wall-clock benchmarks (faults and soak, Flower's
deployment engine, a device's footprint, a continuous run, inference, the aggregator at scale,
bursts through a stock broker): one function per benchmark, as in ``dev/bench_results.py``,
which joins them with the others."""

from __future__ import annotations

import statistics

from bench_format import Doc, bullet, fmt_pct, fmt_seeds, fmt_spread, fmt_verdict, fmt_x, one_entry

__all__ = [
    "PI_FREE_GOAL",
    "ROUND_GOAL",
    "agent",
    "bursts",
    "deployment",
    "footprint",
    "idle_fleet",
    "inference",
    "reliability",
    "scale",
    "service",
]

#: fedstream's median round against plain Flower's, wall clock: at most this (the issue's goal).
ROUND_GOAL = 1.2
#: The share of a 1 GB Raspberry Pi a device's processes should leave free.
PI_FREE_GOAL = 0.40
#: The dynamic controller reaches 0.9 at least this much sooner than the fixed split (wall).
CONTROLLER_GAIN = 0.20
#: A ClientApp handing over to an agent: at most this many CPU-s over Flower's do-nothing one.
AGENT_CPU_OVER = 0.4


def reliability(doc: Doc) -> str:
    """Faults, soak, hostile input and security (``reliability.json``).

    Reads the soak's entries (``published``, ``achieved_rate``), ``samples``
    (``acknowledged``, ``accepted``, ``lost``), ``faults`` (``injected``, ``survived``,
    ``resume_equivalence.identical``), ``security`` (``tried``, ``passed``) and ``hostile``
    (``tried``, ``crashed``).
    """
    soak = doc["entries"]
    samples, faults, security, hostile = (
        doc[k] for k in ("samples", "faults", "security", "hostile")
    )
    resumed = (
        "the same model as uninterrupted"
        if faults["resume_equivalence"]["identical"]
        else "a model that differs from the uninterrupted run's"
    )
    return bullet(
        f"""**Faults, soak, security**: wall, one run: {sum(e["published"] for e in soak):,}
        samples at {sum(e["achieved_rate"] for e in soak):,.0f} msg/s into {len(soak)}
        daemons with a daemon `kill -9`, plus a broker crash, a broker restart and a full
        disk: {samples["acknowledged"]:,} acknowledged, {samples["accepted"]:,} accepted,
        {samples["lost"]:,} lost; aggregator killed and resumed ({resumed});
        {faults["survived"]} of {faults["injected"]} faults and {security["passed"]} of
        {security["tried"]} security checks passed; {hostile["tried"]:,} hostile payloads,
        {hostile["crashed"]} crashes. `fedstream bench reliability`."""
    )


def deployment(doc: Doc) -> str:
    """A round on the wall clock against plain Flower (``deployment.json``).

    With ``ratios`` and ``repetitions`` (the JSON since repetitions were added): each fedstream
    variant's ``mean``, ``min`` and ``max`` over each plain baseline; an older JSON (one run
    per variant): the entries' ``round_wall_median_s`` and ``vs_plain_tuned``. Both: the
    fedstream entries' ``breakdown.training_share``, ``devices``, ``rounds`` and
    ``controllers`` (``round_wall_median_s``, ``time_to_s``, ``seeds``).
    """
    entries = doc["entries"]
    idle = [e for e in entries if e["variant"] == "fedstream-idle"]
    ratios = doc.get("ratios")
    if ratios is None:  # the older format: one run per variant, no pull-loop variant
        live = one_entry(entries, variant="fedstream-live")
        ratio = idle[0]["vs_plain_tuned"]
        comparison = f"""one run per variant: fedstream's median round with its streams idle
            {idle[0]["round_wall_median_s"]:.2f} s, {ratio:.2f}x the plain Flower app's as
            written (`Strategy.start`, whose pull loop sleeps 3 s) on the same SuperNodes
            (goal <= {ROUND_GOAL:g}x: {fmt_verdict(ratio <= ROUND_GOAL)}),
            {live["vs_plain_tuned"]:.2f}x with live streams (this run has no plain app with
            fedstream's 0.2 s pull loop)"""
    else:

        def r(variant: str, base: str) -> str:
            x = ratios[variant][base]
            return f"{x['mean']:.2f}x ({x['min']:.2f}-{x['max']:.2f})"

        idle_r = ratios["fedstream-idle"]
        verdicts = ", ".join(  # in every repetition: its largest ratio
            fmt_verdict(idle_r[b]["max"] <= ROUND_GOAL)
            for b in ("plain-flower-tuned", "plain-flower-tuned-pull")
        )
        comparison = f"""{doc["repetitions"]} alternated repetitions, the ratio's mean
            (min-max): fedstream's median round with its streams idle is
            {r("fedstream-idle", "plain-flower-tuned")} the plain Flower app's as written
            (`Strategy.start`, whose pull loop sleeps 3 s) and {
            r("fedstream-idle", "plain-flower-tuned-pull")
        } the same app's with fedstream's 0.2 s pull loop, on
            the same SuperNodes (goal <= {ROUND_GOAL:g}x: {verdicts}); with live streams
            {r("fedstream-live", "plain-flower-tuned")} and {
            r("fedstream-live", "plain-flower-tuned-pull")
        }"""
    share = fmt_pct([e["breakdown"]["training_share"] for e in idle])
    return bullet(
        f"""**A round on the wall clock, against plain Flower**: wall, Flower's deployment
        engine on this machine, {doc["devices"]} devices, {doc["rounds"]} rounds,
        {comparison}; the devices train for {share} of an idle round (process start and
        Flower's polls are the rest). {_tasks(doc)}{_controllers(doc)} `fedstream bench
        deployment`."""
    )


def _goal(doc: Doc, name: str, fmt: str = "{:.2f}") -> str:
    """A judged goal of ``doc["goals"]``: its value in each repetition or seed (``fmt``),
    and its verdict."""
    goal = doc["goals"][name]
    values = ", ".join("-" if v is None else fmt.format(v) for v in goal["values"])
    return f"{values} ({goal['verdict']})"


def _tasks(doc: Doc) -> str:
    """The agents taking their SuperNodes' tasks, against the goals the JSON judged (none
    before it judged them)."""
    if "goals" not in doc:
        return ""
    from deploy.bench.deployment_goals import (
        GOAL_ABOVE_COMPUTE_S,
        GOAL_DEVICE_CPU_S,
        GOAL_VS_PLAIN,
    )

    share = fmt_pct(
        [
            e["breakdown"]["training_share"]
            for e in doc["entries"]
            if e["variant"] == "fedstream-idle-agent"
        ]
    )
    return f"""With an agent per device taking its SuperNode's tasks (no process per message,
        `fedstream-idle-agent`), per repetition: the median round is
        {_goal(doc, "idle-round-vs-plain", "{:.2f}x")} the plain app's as written (goal <=
        {GOAL_VS_PLAIN:g}x in every repetition),
        {_goal(doc, "idle-round-above-compute-s", "{:.2f} s")} above the slowest device's
        compute (goal <= {GOAL_ABOVE_COMPUTE_S:g} s), a device spends
        {_goal(doc, "device-cpu-s-per-idle-round", "{:.2f} CPU-s")} per round, its
        SuperNode's and agent's polling between rounds included (goal <=
        {GOAL_DEVICE_CPU_S:g}), and trains for {share} of it. """


def _controllers(doc: Doc) -> str:
    """The controllers' sentence: at the defaults (the JSON since the controller runs took
    them), else the trio of the runs before."""
    if "controller-dynamic-no-probe" not in doc["controllers"]:
        return _controllers_at_defaults(doc)
    return _controller_trio(doc)


def _controllers_at_defaults(doc: Doc) -> str:
    """The fixed and dynamic arms at the run config's defaults: each seed's time to 0.9
    over the fixed split's, and the slowest device's training share (``goals``)."""
    from deploy.bench.deployment_goals import GOAL_CONTROLLER_RATIO, GOAL_SLOWEST_SHARE

    c = doc["controllers"]
    fixed, dynamic = c["controller-fixed"], c["controller-dynamic"]
    return f"""The controllers with agents, slowdowns 1, 1, 2, 4, every run-config key at
        its default but the controller, the work ({doc["controller_local_steps"]} local steps
        of a {doc["controller_model_width"]}-wide CNN), the rounds and the seed (global batch
        512, aggregation adaptive, the timing probe on and charged),
        {fmt_seeds(fixed["seeds"])}: under the fixed split the slowest device trains for
        {_goal(doc, "controller-fixed-slowest-training-share", "{:.0%}")} of its round (goal
        >= {GOAL_SLOWEST_SHARE:.0%}); the batch controller's median round is
        {dynamic["round_wall_median_s"]} s against the fixed split's
        {fixed["round_wall_median_s"]} s, and it reaches test accuracy 0.9 in
        {dynamic["time_to_s"]["0.9"]} s against {fixed["time_to_s"]["0.9"]} s:
        {_goal(doc, "controller-time-to-0.9", "{:.2f}x")} the fixed split's time, seed by seed
        (goal <= {GOAL_CONTROLLER_RATIO:g}x in every seed)."""


def _controller_trio(doc: Doc) -> str:
    """The controller trio's sentence: each seed's time to 0.9 against the fixed split's,
    with round 1 split equally (the goal's arm) and with the timing probe, and the slowest
    device's training share."""
    c = doc["controllers"]
    fixed = c["controller-fixed"]
    by = {
        name: {e["seed"]: e for e in doc["entries"] if e["variant"] == f"controller-{name}"}
        for name in ("fixed", "dynamic", "dynamic-no-probe")
    }
    seeds = sorted(by["fixed"])

    def ratio(name: str) -> list[float | None]:
        """Each seed's time to 0.9 over the fixed split's."""
        out: list[float | None] = []
        for seed in seeds:
            f, d = by["fixed"][seed]["time_to_s"]["0.9"], by[name][seed]["time_to_s"]["0.9"]
            out.append(None if f is None or d is None else d / f)
        return out

    probe, no_probe = ratio("dynamic"), ratio("dynamic-no-probe")
    met = all(r is not None and r <= 1 - CONTROLLER_GAIN for r in no_probe)
    shares = [by["fixed"][s]["slowest_training_share"] for s in seeds]
    replaced = c["controller-dynamic-no-probe"]
    return f"""With device agents, slowdowns 1, 1, 2, 4, {doc["controller_batch_per_device"]}
        samples a step on each device, {doc["controller_local_steps"]} local steps of a
        {doc["controller_model_width"]}-wide CNN ({doc["controller_aggregation"]}), so that
        training is {fmt_pct(shares)} of the slowest device's round under the fixed split: the
        batch controller's median round is {replaced["round_wall_median_s"]} s against the
        fixed split's {fixed["round_wall_median_s"]} s; round 1 split equally (no timing
        probe: each device times two step sizes in it, so round 2's plan has the slope), it
        reaches test accuracy 0.9 in {replaced["time_to_s"]["0.9"]} s against
        {fixed["time_to_s"]["0.9"]} s: {fmt_x(no_probe)} the fixed split's time (goal <=
        {1 - CONTROLLER_GAIN:.1f}x in every seed: {fmt_verdict(met)}); with the timing probe
        (one more Flower exchange before round 1, charged) {fmt_x(probe)} ({fmt_seeds(seeds)})."""


def agent(doc: Doc) -> str:
    """The device agent on the deployment engine (``deployment.json`` since agents).

    Reads ``agent`` (``per_repetition``: the ClientApp's CPU seconds with agents and of
    Flower's do-nothing ClientApp, the device's CPU seconds per round and the live round's
    wall time with agents over without, the device's peak PSS and the processes with torch
    mapped) and ``soak`` (``rss_bytes``, ``messages``).
    """
    if "agent" not in doc:
        return ""
    rows = doc["agent"]["per_repetition"]
    over = [r["agent_clientapp_cpu_over_do_nothing_s"] for r in rows]
    cpu = [r["device_cpu_ratio"] for r in rows]
    wall = [r["live_round_wall_ratio"] for r in rows]
    pss = max(r["pss_peak_bytes"]["agent"] for r in rows) / (1 << 20)
    torch_clientapps = sum(r["torch_processes"]["agent"].get("clientapp", 0) for r in rows)
    agents = max(r["torch_processes"]["agent"].get("agent", 0) for r in rows)
    soak = doc["soak"]
    rss = soak["rss_bytes"]
    growth = (rss[-1][1] - rss[1][1]) / rss[1][1]
    soak_goal = (
        f" (goal <= +5 %: {doc['goals']['soak-rss-growth']['verdict']}; taken by the agent "
        "from a real SuperNode, a round each)"
        if "goals" in doc
        else ""
    )
    if "goals" in doc:  # the agents take their SuperNodes' tasks: no ClientApp process
        how = "taking its SuperNode's tasks: no process per message"
        clientapp = f"""no ClientApp process at all (Flower's own do-nothing ClientApp costs
            {fmt_spread([r["do_nothing_clientapp_cpu_s"] for r in rows])} CPU-s per message),"""
    else:
        how = "each message's ClientApp hands over"
        clientapp = f"""a ClientApp costs {fmt_spread(over, "{:+.2f}")} CPU-s per message over
            Flower's own do-nothing ClientApp (goal <= +{AGENT_CPU_OVER:g}:
            {fmt_verdict(max(over) <= AGENT_CPU_OVER)}), {torch_clientapps} ClientApp
            processes loaded torch ({agents} agents did, one per device);"""
    return bullet(
        f"""**The device agent** (torch and the model loaded once per device; {how}): wall,
        the same runs, {len(rows)} repetitions, mean (min-max): {clientapp} a device's CPU-s
        per round in the
        steady state {fmt_x(cpu)} of the same run's without agents (goal <= 0.5x:
        {fmt_verdict(max(cpu) <= 0.5)}); the live round {fmt_x(wall)} (goal <= 0.8x:
        {fmt_verdict(max(wall) <= 0.8)}); a device's processes at most {pss:.0f} MiB at once
        (PSS; goal <= 500 MiB: {fmt_verdict(pss <= 500)}; {100 * (1 - pss / 1024):.0f} % of a
        1 GB Pi free); over {soak["messages"]} messages
        the agent's resident memory went from {rss[1][1] / (1 << 20):.0f} MiB (message
        {rss[1][0]}) to {rss[-1][1] / (1 << 20):.0f} MiB ({100 * growth:+.1f} %){soak_goal}.
        `fedstream bench deployment`."""
    )


def footprint(doc: Doc) -> str:
    """What a device runs, measured in the live runs (``deployment.json``).

    Reads the ``fedstream-live`` entries' ``footprint`` (``pss_peak_bytes``,
    ``pi_1gb_headroom``, ``written_per_accepted_sample``, ``sample_bytes``,
    ``write_amplification``) and ``commit_interval_s``, and the same of the
    ``fedstream-live-commit-*`` entry.
    """
    live = [e for e in doc["entries"] if e["variant"] == "fedstream-live"]
    old = [e for e in doc["entries"] if e["variant"].startswith("fedstream-live-commit-")]
    prints, old_prints = [e["footprint"] for e in live], [e["footprint"] for e in old]
    pss = max(f["pss_peak_bytes"] for f in prints) / (1 << 20)
    free = min(f["pi_1gb_headroom"] for f in prints)
    runs = "the live run" if len(live) == 1 else f"{len(live)} live runs"

    def written(of: list[Doc]) -> str:
        per_sample = fmt_spread([f["written_per_accepted_sample"] for f in of], "{:,.0f}")
        return f"{per_sample} ({fmt_x([f['write_amplification'] for f in of], '{:.1f}')})"

    against = (
        f""" against {written(old_prints)} with commits every {old[0]["commit_interval_s"]:g} s"""
        if old
        else ""
    )
    return bullet(
        f"""**Device footprint** (without agents): wall, {runs}: ingest daemon + SuperNode +
        SuperExec + ClientApp at most {pss:.0f} MiB at once (PSS), at least
        {100 * free:.0f} % of a 1 GB Pi free (goal >= {100 * PI_FREE_GOAL:.0f} %:
        {fmt_verdict(free >= PI_FREE_GOAL)}); {written(prints)} bytes written per accepted
        {prints[0]["sample_bytes"]:,}-byte sample with transactions gathered up to
        {live[0]["commit_interval_s"]:g} s{against}. `fedstream bench deployment`."""
    )


def service(doc: Doc) -> str:
    """A continuous run for a day (``service.json``).

    Reads ``virtual_s`` and the entry's ``samples`` (``round``, ``rss_mb``,
    ``checkpoint_mb``, ``metrics_mb``, ``exports_mb``, ``buffers_mb``), ``memory_growth`` and
    ``disk_limits_mb``.
    """
    from deploy.bench.continuous_run import EXPORT_KEEP, MEMORY_GROWTH, METRICS_KEEP, METRICS_MB

    entry = doc["entries"][0]
    samples = entry["samples"]
    base, end = samples[max(0, len(samples) // 10 - 1)], samples[-1]
    growth, limits = entry["memory_growth"], entry["disk_limits_mb"]
    disk_ok = all(s[k] <= v for s in samples for k, v in limits.items())
    flat = next(
        s
        for s in samples
        if all(t["buffers_mb"] == end["buffers_mb"] for t in samples[samples.index(s) :])
    )
    return bullet(
        f"""**A continuous run for a day**: virtual clock, in-process runner, 2 devices,
        {end["round"]:,} rounds in {doc["virtual_s"] / 3600:.0f} h: resident memory
        {base["rss_mb"]:.0f} MB at round {base["round"]:,} and {end["rss_mb"]:.0f} MB at the
        end ({100 * growth:+.1f} %; goal <= {100 * MEMORY_GROWTH:.0f} %, disk within its
        bounds: {fmt_verdict(growth <= MEMORY_GROWTH and disk_ok)}), checkpoint
        {end["checkpoint_mb"]:.2f} MB, metrics at most
        {max(s["metrics_mb"] for s in samples):.1f} MB (rotated at {METRICS_MB:g} MB,
        {METRICS_KEEP} kept), exports at most {max(s["exports_mb"] for s in samples):.2f} MB
        ({EXPORT_KEEP} kept), the two buffer files {end["buffers_mb"]:.0f} MB from round
        {flat["round"]:,} on (flat: SQLite's write-ahead log at its high-water mark).
        `fedstream bench service`."""
    )


def inference(doc: Doc) -> str:
    """On-device inference (``inference.json``).

    Reads the default CNN's ``samples_per_s`` and the two daemon entries' ``samples``,
    ``predicted``, ``samples_per_s``, ``latency_median_s`` and ``latency_p99_s``.
    """
    from deploy.bench.inference import BATCHES, FASTEST_RATE

    cnn = next(e for e in doc["entries"] if e.get("model", "").startswith("cnn (default"))
    fast, paced = (e for e in doc["entries"] if "daemon" in e)
    every = (
        "every sample"
        if paced["predicted"] == paced["samples"]
        else f"{paced['predicted']:,} of {paced['samples']:,} samples"
    )
    rate = cnn["samples_per_s"]
    return bullet(
        f"""**On-device inference**: wall: the default CNN exported with `torch.export`,
        {rate["1"]:,.0f} samples/s one at a time, {rate[str(BATCHES[-1])]:,.0f}/s in batches
        of {BATCHES[-1]}; `fedstream infer` end to end {fast["samples_per_s"]:,.0f} samples/s,
        and at {FASTEST_RATE:.0f} samples/s (ScaDLES S2's mean + 1 sd) {every} predicted with
        a median latency of {1000 * paced["latency_median_s"]:.1f} ms (p99
        {1000 * paced["latency_p99_s"]:.1f} ms). `fedstream bench inference`."""
    )


def scale(doc: Doc) -> str:
    """The aggregator at scale (``scale.json``).

    Reads the dense (``mode`` ``none``) entries' ``devices``, ``round_s``, ``per_device_ms``
    and ``params``, and ``goals`` (``met.round_s``, ``per_device_kb``, ``fixed_mb``).
    """
    from deploy.bench.scale import GOALS

    dense = [e for e in doc["entries"] if e["mode"] == "none"]
    at = one_entry(dense, devices=GOALS["devices"])
    per = [e["per_device_ms"] for e in dense]
    goals = doc["goals"]
    return bullet(
        f"""**Aggregator at scale**: wall, a quiet host: a steady-state round (after the
        controller has fitted) through the ServerApp's own exchange takes
        {at["round_s"]:.2f} s for {at["devices"]:,} devices on a {at["params"]:,}-parameter
        model (goal <= {GOALS["round_s"]:g} s: {fmt_verdict(goals["met"]["round_s"])}),
        {min(per):.1f}-{max(per):.1f} ms per device from {dense[0]["devices"]:,} to
        {dense[-1]["devices"]:,} devices; a round's peak memory is O(model) in the real
        ServerApp: about {goals["per_device_kb"]:.1f} kB per device +
        {goals["fixed_mb"]:.0f} MB. `fedstream bench scale`."""
    )


def idle_fleet(doc: Doc) -> str:
    """An idle fleet's load on its SuperLink (``idle.json``).

    Reads ``nodes``, ``window_s``, each entry's ``arm``, ``superlink-cpu-s``,
    ``supernodes-cpu-s`` and ``window-s``, and ``goals.superlink-cpu-vs-flower``
    (``per_repetition``, ``threshold``).
    """
    goal = doc["goals"]["superlink-cpu-vs-flower"]
    ratios = goal["per_repetition"]
    met = sum(r <= goal["threshold"] for r in ratios)

    def per_min(arm: str, key: str, each: int = 1) -> str:
        return fmt_spread(
            [e[key] / each / (e["window-s"] / 60) for e in doc["entries"] if e["arm"] == arm],
            "{:.3f}",
        )

    return bullet(
        f"""**An idle fleet's load on its SuperLink**: wall, {doc["nodes"]} SuperNodes
        connected, no run, {doc["window_s"]:.0f} s: the SuperLink spent
        {per_min("fedstream", "superlink-cpu-s")} CPU-s a minute under fedstream's
        SuperNodes and agents, {per_min("flower", "superlink-cpu-s")} under Flower's own,
        {", ".join(f"{r:.2f}x" for r in ratios)} per repetition (goal <= {goal["threshold"]:g}x
        in every one: {met} of {len(ratios)}, {fmt_verdict(met == len(ratios))}); each
        SuperNode {per_min("fedstream", "supernodes-cpu-s", doc["nodes"])} CPU-s a minute
        against {per_min("flower", "supernodes-cpu-s", doc["nodes"])}. `fedstream bench
        idle`."""
    )


def bursts(doc: Doc) -> str:
    """Bursts through a stock broker (``bursts.json``).

    Reads each entry's ``burst``, ``mqtt-version`` and its ``runs`` (``sent``, ``lost``,
    ``counted-missing``), and ``lossless-up-to``, ``subscribed-s`` and ``subscribe-goal-s``.
    """
    entries = doc["entries"]
    goal_burst = doc["lossless-up-to"]

    def lost(e: Doc) -> str:
        return fmt_spread([r["lost"] / r["sent"] for r in e["runs"]], "{:.0%}")

    within = [e for e in entries if e["mqtt-version"] == "5" and e["burst"] <= goal_burst]
    beyond = [e for e in entries if e["mqtt-version"] == "5" and e["burst"] > goal_burst]
    whole = all(r["lost"] == 0 for e in within for r in e["runs"])
    larger = "; ".join(f"{e['burst']:,}: {lost(e)} lost" for e in beyond)
    old = ", ".join(f"{lost(e)} of {e['burst']:,}" for e in entries if e["mqtt-version"] == "3.1.1")
    runs = [r for e in entries for r in e["runs"]]
    counted = sum(r["counted-missing"] == r["lost"] for r in runs)
    subscribed = doc["subscribed-s"]
    goal = doc["subscribe-goal-s"]
    return bullet(
        f"""**Bursts through a stock broker**: wall: a Mosquitto with nothing but a listener,
        bursts from `mosquitto_pub`; over MQTT 5 the ingest daemon took bursts of up to
        {goal_burst:,} readings whole (goal: {fmt_verdict(whole)}; beyond: {larger}), forced
        to 3.1.1 it lost {old} at the broker; in {counted} of {len(runs)} runs it counted
        exactly what was lost. `fedstream ingest` was connected and subscribed
        {statistics.median(subscribed):.2f} s (median; at most {max(subscribed):.2f} s) after
        its start (goal <= {goal:g} s: {fmt_verdict(max(subscribed) <= goal)}).
        `fedstream bench bursts`."""
    )
