"""``systemctl`` for the deployment docs' test: start a unit's ``ExecStart`` as systemd would
resolve it, as the calling user, with no sandboxing and no restarts.

What it does of systemd: unit files from ``$SHIM_UNIT_PATH`` (colon-separated folders),
templates (``name@instance``, ``%i``), ``Environment=`` overridden by ``EnvironmentFile=``,
``ExecStart=`` split into words before ``${VAR}`` (one word) and ``$VAR`` (split at
whitespace) are expanded, a clean environment, ``KillMode=mixed``. Each started unit is a
session of its own; its pid and output go to ``$SHIM_STATE/<unit>.{pid,log}``, where the test
finds them to kill what is left. What it does not: ``User=`` (the caller's user runs it),
hardening, ``Restart=`` (the test plays systemd's restart where the docs rely on it).

    systemctl daemon-reload | enable [--now] UNIT... | start UNIT... | stop UNIT...
              | restart UNIT... | kill [-s SIG | --signal=SIG] UNIT... | is-active UNIT
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

STATE = Path(os.environ["SHIM_STATE"])
UNIT_PATH = [Path(p) for p in os.environ["SHIM_UNIT_PATH"].split(":") if p]
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def unit_name(name: str) -> str:
    return name if name.endswith(".service") else f"{name}.service"


def read_unit(name: str) -> tuple[dict[str, list[str]], str]:
    """The ``[Service]`` settings of ``name`` (specifiers resolved) and its instance."""
    stem = name.removesuffix(".service")
    instance = ""
    file_name = name
    if "@" in stem:
        prefix, instance = stem.split("@", 1)
        file_name = f"{prefix}@.service"
    for folder in UNIT_PATH:
        if (folder / file_name).exists():
            text = (folder / file_name).read_text()
            break
    else:
        sys.exit(f"systemctl (docs test): Unit {name} not found in {UNIT_PATH}")
    text = re.sub(r"\\\n", " ", text)  # continuation lines
    text = text.replace("%%", "\0").replace("%i", instance).replace("%I", instance)
    text = text.replace("%n", name).replace("\0", "%")
    settings: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]" and "=" in line:
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings, instance


def unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def environment(settings: dict[str, list[str]]) -> dict[str, str]:
    env = {
        "PATH": BASE_PATH,
        "LANG": "C.UTF-8",
        "HOME": os.environ.get("HOME", "/"),
        "USER": os.environ.get("USER", ""),
        "LOGNAME": os.environ.get("USER", ""),
    }
    for line in settings.get("Environment", []):
        for word in shlex.split(line):
            key, _, value = word.partition("=")
            env[key] = value
    for path in settings.get("EnvironmentFile", []):
        optional = path.startswith("-")
        path = path.lstrip("-")
        if not Path(path).exists():
            if optional:
                continue
            sys.exit(f"systemctl (docs test): EnvironmentFile {path} does not exist")
        for raw in Path(path).read_text().splitlines():
            raw = raw.strip()
            if not raw or raw[0] in "#;" or "=" not in raw:
                continue
            key, _, value = raw.partition("=")
            env[key.strip()] = unquote(value.strip())
    return env


def command_line(line: str, env: dict[str, str]) -> list[str]:
    argv: list[str] = []
    for word in shlex.split(line):
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:
            argv.extend(env.get(whole.group(1), "").split())
            continue
        argv.append(
            re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word)
        )
    argv[0] = argv[0].lstrip("@-:+!")
    return argv


def pid_of(name: str) -> int | None:
    path = STATE / f"{name}.pid"
    if not path.exists():
        return None
    pid = int(path.read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return None
    return pid


def start(name: str) -> None:
    if pid_of(name) is not None:
        return
    settings, _ = read_unit(name)
    env = environment(settings)
    (exec_start,) = settings["ExecStart"]
    argv = command_line(exec_start, env)
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(
            argv, env=env, cwd=settings.get("WorkingDirectory", ["/"])[0],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    (STATE / f"{name}.pid").write_text(str(proc.pid))


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants: what systemd's cgroup holds, a new session's too."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(children.get(found[-1], []))
    return found


def send(name: str, sig: int, main_only: bool = False) -> None:
    pid = pid_of(name)
    if pid is None:
        return
    targets = [pid] if main_only else tree(pid)
    if not main_only:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
    for target in targets:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, sig)


def stop(name: str) -> None:
    pid = pid_of(name)
    if pid is None:
        return
    settings, _ = read_unit(name)
    mixed = settings.get("KillMode", ["control-group"])[0] == "mixed"
    left = tree(pid)
    send(name, signal.SIGTERM, main_only=mixed)
    timeout = min(float(settings.get("TimeoutStopSec", ["90"])[0]), 60.0)
    deadline = time.monotonic() + timeout
    while pid_of(name) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    send(name, signal.SIGKILL)
    for straggler in left:  # what the main process left behind (reparented)
        with contextlib.suppress(ProcessLookupError):
            os.kill(straggler, signal.SIGKILL)
    (STATE / f"{name}.pid").unlink(missing_ok=True)


def main(args: list[str]) -> int:
    if not args:
        sys.exit(__doc__)
    verb, rest = args[0], args[1:]
    flags = [a for a in rest if a.startswith("-")]
    sig = signal.SIGTERM
    for i, arg in enumerate(rest):
        if arg.startswith("--signal="):
            sig = signal.Signals["SIG" + arg.partition("=")[2].upper().removeprefix("SIG")]
        elif arg == "-s":
            sig = signal.Signals["SIG" + rest[i + 1].upper().removeprefix("SIG")]
            flags.append(rest[i + 1])
    units = [unit_name(a) for a in rest if a not in flags]
    steps = {
        "daemon-reload": (),
        "enable": (start,) if "--now" in flags else (),
        "start": (start,),
        "stop": (stop,),
        "restart": (stop, start),
    }
    if verb in steps:
        for name in units:
            for step in steps[verb]:
                step(name)
        return 0
    if verb == "kill":
        for name in units:
            send(name, sig)
            if sig == signal.SIGKILL:
                (STATE / f"{name}.pid").unlink(missing_ok=True)
        return 0
    if verb == "is-active":
        active = all(pid_of(name) is not None for name in units)
        print("active" if active else "inactive")
        return 0 if active else 3
    sys.exit(f"systemctl (docs test): {verb} is not supported")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
