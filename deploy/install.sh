#!/usr/bin/env bash
# Install fedstream in its own virtual environment and its systemd units, as current Debian and
# Raspberry Pi OS want it (their system pip refuses to install: PEP 668).
#
#   [PYTHON=python3] deploy/install.sh [--prefix /opt/fedstream] [--source PATH|SPEC]
#                     [--extras demo] [--units /etc/systemd/system] [--user fedstream]
#                     [--state-dir /var/lib/fedstream] [--config-dir /etc/fedstream]
#                     [--system-site-packages] [--no-system-user]
#
# - a venv in PREFIX/venv with fedstream (SOURCE: a checkout, a wheel, or a pip spec such as
#   "fedstream==0.1.0"; default: the checkout this script is in);
# - fedstream's Flower app in PREFIX/app (`flwr run PREFIX/app <connection>`, no checkout);
# - the units of deploy/systemd, their programs pointed into the venv, their settings read
#   from CONFIG_DIR, written to UNITS, checked with `systemd-analyze verify` where available;
# - as root (unless --no-system-user): the system user USER that the units run as, and
#   STATE_DIR owned by it; as root, an interpreter USER cannot run is refused (PYTHON: the
#   interpreter the venv is made from, Python >= 3.11; under sudo write it after sudo:
#   `sudo PYTHON=/usr/bin/python3.11 deploy/install.sh`, sudo drops it otherwise).
# Then: systemctl daemon-reload and enable the units this machine runs (see docs/deployment.md).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
prefix=/opt/fedstream
source_spec=$(dirname "$here")
extras=""
units=/etc/systemd/system
user=fedstream
state=/var/lib/fedstream
config=/etc/fedstream
venv_args=()
make_user=1

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
    case $1 in
        --prefix) prefix=${2:?}; shift 2 ;;
        --source) source_spec=${2:?}; shift 2 ;;
        --extras) extras=${2:?}; shift 2 ;;
        --units) units=${2:?}; shift 2 ;;
        --user) user=${2:?}; shift 2 ;;
        --state-dir) state=${2:?}; shift 2 ;;
        --config-dir) config=${2:?}; shift 2 ;;
        # Reuse the system's packages (e.g. NVIDIA's torch on a Jetson) and its pip.
        --system-site-packages) venv_args+=(--system-site-packages --without-pip); shift ;;
        --no-system-user) make_user=0; shift ;;
        -h|--help) usage 0 ;;
        *) echo "install.sh: unknown option $1" >&2; usage ;;
    esac
done
python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "install.sh: $python is not Python >= 3.11 (flwr 1.42 needs it)" >&2
    exit 1
fi
[[ $user =~ ^[a-z_][a-z0-9_-]*$ ]] || { echo "install.sh: bad user name $user" >&2; exit 2; }

# The units run as USER: made first, so that the interpreter can be tried as USER before
# anything is installed.
if [ "$(id -u)" = 0 ] && [ "$make_user" = 1 ] && ! id "$user" >/dev/null 2>&1; then
    useradd --system --home-dir "$state" --no-create-home --shell /usr/sbin/nologin "$user"
    echo "made system user $user"
fi

# runnable_by PROGRAM: refuse, with the reason and the fix, an interpreter USER cannot run
# (e.g. pyenv's, under a home folder of mode 700): the units would fail at their first start
# with "bad interpreter: Permission denied". Checked as root only (it needs runuser).
runnable_by() {
    [ "$(id -u)" = 0 ] && id "$user" >/dev/null 2>&1 && command -v runuser >/dev/null || return 0
    local why
    if ! why=$(runuser -u "$user" -- "$1" -c pass 2>&1); then
        echo "install.sh: the units' user $user cannot run $1 (${why:-no reason given})." >&2
        echo "  The venv's python links to the interpreter it was made from, and the units" >&2
        echo "  run it as $user. Make the venv from an interpreter every user may run, e.g." >&2
        echo "  the system's: sudo PYTHON=/usr/bin/python3.11 $0 ...  (sudo drops PYTHON" >&2
        echo "  unless it is written after sudo), or let $user reach this one." >&2
        exit 1
    fi
}
runnable_by "$("$python" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')"

echo "venv: $prefix/venv"
mkdir -p "$prefix"
"$python" -m venv "${venv_args[@]}" "$prefix/venv"
runnable_by "$prefix/venv/bin/python"   # the prefix, too, must be reachable
spec=$source_spec
[ -n "$extras" ] && spec="$source_spec[$extras]"
"$prefix/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$spec"
# Flower's programs in the venv's bin, where the units and Flower itself (it starts
# flower-superexec and the app processes by name, from PATH) look for them: pip puts them
# there unless flwr came from the system's packages (--system-site-packages).
"$prefix/venv/bin/python" - "$prefix/venv/bin" <<'PY'
import sys
from importlib.metadata import distribution
from pathlib import Path

bin_dir = Path(sys.argv[1])
for ep in distribution("flwr").entry_points.select(group="console_scripts"):
    script = bin_dir / ep.name
    if not script.exists():
        module, _, attr = ep.value.partition(":")
        script.write_text(
            f"#!{bin_dir / 'python'}\nimport sys\nfrom {module} import {attr.split('.')[0]}\n"
            f"sys.exit({attr}())\n"
        )
        script.chmod(0o755)
PY
# Flower's log lines without colour codes where NO_COLOR is set, as the units set it
# (journald keeps the escape sequences otherwise; see deploy/plain_logs.py).
"$prefix/venv/bin/python" - <<'PY'
import sysconfig
from pathlib import Path

from deploy.plain_logs import PTH_FILE, PTH_LINE

Path(sysconfig.get_path("purelib"), PTH_FILE).write_text(PTH_LINE + "\n")
PY
"$prefix/venv/bin/fedstream" --version
"$prefix/venv/bin/fedstream" app "$prefix/app"

echo "units: $units"
mkdir -p "$units"
for unit in "$here"/systemd/*.service; do
    sed -e "s#/opt/fedstream#$prefix#g" -e "s#/usr/local/bin#$prefix/venv/bin#g" \
        -e "s#^User=fedstream#User=$user#" -e "s#^Group=fedstream#Group=$user#" \
        -e "s#/var/lib/fedstream#$state#g" -e "s#/etc/fedstream#$config#g" \
        "$unit" > "$units/$(basename "$unit")"
done
if command -v systemd-analyze >/dev/null; then
    # Templates are checked as one instance each; verify needs the programs to exist.
    checked=()
    for unit in "$units"/fedstream-*.service; do
        name=$(basename "$unit")
        if [[ $name == *@.service ]]; then
            cp "$unit" "$units/${name/@/@check}"
            checked+=("$units/${name/@/@check}")
        else
            checked+=("$unit")
        fi
    done
    status=0
    SYSTEMD_LOG_LEVEL=err systemd-analyze verify --man=no "${checked[@]}" || status=$?
    for unit in "$units"/*@check.service; do rm -f "$unit"; done
    [ "$status" = 0 ] || { echo "install.sh: systemd-analyze verify failed" >&2; exit 1; }
    echo "systemd-analyze verify: ok"
fi

if [ "$(id -u)" = 0 ] && [ "$make_user" = 1 ]; then
    install -d -o "$user" -g "$user" -m 0750 "$state"
    echo "user $user owns $state"
else
    mkdir -p "$state"
    echo "no system user made: the units' User=$user must exist where they run"
fi
echo "done: systemctl daemon-reload, then enable the units this machine runs"
