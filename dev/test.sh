#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs, then ruff, mypy, pytest.
#   bash dev/test.sh [extra pytest args]
# It runs in the active virtual environment, else in the checkout's .venv (made when missing):
# PEP 668 systems (Debian 12, Ubuntu 24.04, Raspberry Pi OS) refuse pip into their Python.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
    [ -x .venv/bin/python3 ] || { echo "making .venv (python3 -m venv .venv)"; python3 -m venv .venv; }
    # shellcheck disable=SC1091
    . .venv/bin/activate  # Flower's programs (flower-superlink, flwr) are found on PATH
fi
echo "python: $(command -v python3) ($(python3 -c 'import sys; print(sys.prefix)'))"

python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -e '.[dev]'

# Real-broker tests prefer Mosquitto (Debian's package) and publish with its own client,
# mosquitto_pub; install both when either is missing and we are root.
if { ! command -v mosquitto >/dev/null && [ ! -x /usr/sbin/mosquitto ]; } \
    || ! command -v mosquitto_pub >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing mosquitto (Debian package)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            mosquitto mosquitto-clients >/dev/null
    else
        echo "mosquitto not found and cannot install it: Mosquitto-only tests will skip" >&2
    fi
fi

python3 -m ruff check .
python3 -m ruff format --check .
python3 -m mypy
# pytest exits 5 when it collects no test: that fails this script too (set -e).
if [ $# -gt 0 ]; then
    python3 -m pytest -q -ra --durations=25 "$@"
else
    # The tiers that start processes run on as many pytest-xdist workers as cores are idle
    # now, at most two (they wait on streams, rounds and Flower's polls: one at a time left
    # about half of two cores idle, 1,354 s in a clean-clone CI run; two at once 802-870 s), and
    # beside them, at a lower priority, the unit tier on every core. On a machine already
    # busy (a CPU-bound process beside on two cores) they go one at a time: two workers and
    # that process together starve their streams and round timings.
    unit_tmp=$(mktemp -d "${TMPDIR:-/tmp}/fedstream-unit-XXXXXX")
    trap 'kill "${unit_pid:-}" 2>/dev/null || true; rm -rf "$unit_tmp"' EXIT
    workers=$(python3 -c 'import os; print(min(4, os.cpu_count() or 1))')
    process_workers=$(python3 dev/idle_cores.py --most 2)
    echo "process tiers: $process_workers pytest-xdist worker(s) (cores idle now, at most 2)"
    nice -n 10 python3 -m pytest -q -ra --durations=10 -n "$workers" -m unit \
        --basetemp "$unit_tmp/tmp" >"$unit_tmp/log" 2>&1 &
    unit_pid=$!
    processes_rc=0
    python3 -m pytest -q -ra --durations=25 -n "$process_workers" --dist worksteal -m 'not unit' \
        || processes_rc=$?
    unit_rc=0
    wait "$unit_pid" || unit_rc=$?
    unit_pid=""
    echo "--- the unit tier (run beside the above) ---"
    cat "$unit_tmp/log"
    [ "$unit_rc" = 0 ] || { echo "the unit tier failed (pytest exit $unit_rc)" >&2; exit "$unit_rc"; }
    exit "$processes_rc"
fi
