#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs, then ruff, mypy, pytest.
#   bash dev/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

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
python3 -m pytest -q -ra --durations=25 "$@"
