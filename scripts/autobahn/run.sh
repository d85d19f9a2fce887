#!/usr/bin/env bash
# Runs the Autobahn|Testsuite fuzzingclient (wstest -m fuzzingclient) against a Courier
# server started here, then summarizes the report. See README.md beside this file.
#
# Environment (all optional):
#   COURIER_BIN          the courier binary (default: $CARGO_TARGET_DIR/release/courier,
#                        else target/release/courier of this repository)
#   AUTOBAHN_CACHE       where the tool is installed (default: $HOME/.cache/courier-autobahn)
#   AUTOBAHN_REPORT_DIR  where the report goes (default: $AUTOBAHN_CACHE/report); emptied first
#   AUTOBAHN_CASES       JSON list of case patterns (default: the list below)
#   AUTOBAHN_EXCLUDE     JSON list of case patterns to skip (default: [])
#   AUTOBAHN_PYTHON2     a Python 2.7 interpreter to use instead of looking for one, or
#                        "debian" to use (and fetch if missing) Debian bullseye's python2.7
#
# Exit code: the summarizer's (1 if a real protocol failure remains), or 2 when the run
# itself could not be made.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CACHE=${AUTOBAHN_CACHE:-$HOME/.cache/courier-autobahn}
COURIER_BIN=${COURIER_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/courier}
REPORT_DIR=${AUTOBAHN_REPORT_DIR:-$CACHE/report}
CASES=${AUTOBAHN_CASES:-'["1.*","2.*","3.*","4.*","5.*","6.*","7.*","9.*","10.*","12.*","13.*"]'}
EXCLUDE=${AUTOBAHN_EXCLUDE:-'[]'}

say() { echo "autobahn: $*" >&2; }
die() { say "$*"; exit 2; }

# ---------------------------------------------------------------------------------------
# Install. autobahntestsuite 0.8.2 (the last release, the one in crossbario's Docker
# image) runs on Python 2.7 only. We use, in order:
#   1. $AUTOBAHN_PYTHON2, a Python 2.7 already on the machine (pyenv's 2.7.x,
#      /usr/bin/python2.7, pypy);
#   2. else Debian bullseye's python2.7 .debs (bookworm has no Python 2), downloaded with
#      apt-get through a private apt state in the cache and unpacked there with dpkg -x:
#      nothing is installed system-wide and no apt source of the machine is changed.
# Packages go to $CACHE/site with a pip 20.3.4 wheel (the last pip for 2.7, fetched with
# python3's pip), pinned by the constraints below: the versions that resolve and install
# on Python 2.7 today.
# ---------------------------------------------------------------------------------------
CONSTRAINTS='autobahntestsuite==0.8.2
autobahn==0.10.9
txaio==2.1.0
Twisted==20.3.0
zope.interface==5.5.2
Automat==22.10.0
attrs==21.4.0
constantly==15.1.0
hyperlink==21.0.0
idna==2.10
incremental==22.10.0
PyHamcrest==1.10.1
six==1.17.0
typing==3.10.0.0
klein==20.6.0
Tubes==0.2.1
Werkzeug==1.0.1
enum34==1.1.10
Jinja2==2.11.3
MarkupSafe==1.1.1
pyOpenSSL==21.0.0
cryptography==3.3.2
cffi==1.15.1
pycparser==2.21
ipaddress==1.0.23
service-identity==21.1.0
pyasn1==0.5.1
pyasn1-modules==0.3.0
unittest2==1.1.0
linecache2==1.0.0
traceback2==1.4.0
argparse==1.4.0
wsaccel==0.6.6
ujson==2.0.3'
PIP_WHEEL=pip-20.3.4-py2.py3-none-any.whl
DEB_ROOT=$CACHE/python2.7-bullseye

is_py27() { [ -x "$1" ] && "$1" -c 'import sys, ssl; sys.exit(sys.version_info[:2] != (2, 7))' 2>/dev/null; }

use_debian_python() {
    export PYTHONHOME=$DEB_ROOT/usr
    export LD_LIBRARY_PATH=$DEB_ROOT/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # Debian's pyconfig.h includes <x86_64-linux-gnu/python2.7/pyconfig.h>.
    export CFLAGS="-I$DEB_ROOT/usr/include ${CFLAGS:-}"
    PY2=$DEB_ROOT/usr/bin/python2.7
}

find_python2() {
    PY2=
    if [ "${AUTOBAHN_PYTHON2:-}" = debian ]; then
        [ -x "$DEB_ROOT/usr/bin/python2.7" ] || fetch_debian_python
        use_debian_python; return
    fi
    if [ -n "${AUTOBAHN_PYTHON2:-}" ]; then
        is_py27 "$AUTOBAHN_PYTHON2" || die "AUTOBAHN_PYTHON2=$AUTOBAHN_PYTHON2 is not a working Python 2.7"
        PY2=$AUTOBAHN_PYTHON2; return
    fi
    local c pyenv_root
    pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
    for c in "$pyenv_root"/versions/2.7*/bin/python2.7 /usr/local/bin/python2.7 /usr/bin/python2.7 /usr/bin/pypy; do
        if is_py27 "$c"; then PY2=$c; return; fi
    done
    if [ -x "$DEB_ROOT/usr/bin/python2.7" ]; then
        use_debian_python; is_py27 "$PY2" && return
    fi
    fetch_debian_python
}

fetch_debian_python() {
    say "no Python 2.7 found: fetching Debian bullseye's python2.7 into $DEB_ROOT"
    local apt=$CACHE/apt-bullseye
    mkdir -p "$apt/state/lists/partial" "$apt/cache/archives/partial" "$apt/debs"
    echo 'deb http://deb.debian.org/debian bullseye main' >"$apt/sources.list"
    touch "$apt/state/status"
    local opts=(-o "Dir::State=$apt/state" -o "Dir::State::status=$apt/state/status"
        -o "Dir::Cache=$apt/cache" -o "Dir::Etc::SourceList=$apt/sources.list"
        -o Dir::Etc::SourceParts=/nonexistent -o Dir::Etc::Preferences=/nonexistent
        -o Dir::Etc::PreferencesParts=/nonexistent -o APT::Architecture=amd64
        -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
    apt-get "${opts[@]}" -qq update >&2
    (cd "$apt/debs" && apt-get "${opts[@]}" -qq download python2.7 python2.7-minimal \
        libpython2.7-minimal libpython2.7-stdlib libpython2.7 libpython2.7-dev \
        python2.7-dev libssl1.1 libffi7 >&2)
    rm -rf "$DEB_ROOT.tmp" && mkdir -p "$DEB_ROOT.tmp"
    local f
    for f in "$apt"/debs/*.deb; do dpkg -x "$f" "$DEB_ROOT.tmp"; done
    rm -rf "$DEB_ROOT" && mv "$DEB_ROOT.tmp" "$DEB_ROOT"
    use_debian_python
    is_py27 "$PY2" || die "Debian's python2.7 in $DEB_ROOT does not run"
}

install_tool() {
    local stamp=$CACHE/site/.installed want
    want=$(printf '%s\n%s\n' "$PY2" "$CONSTRAINTS" | sha256sum | cut -d' ' -f1)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
    say "installing autobahntestsuite into $CACHE/site (python: $PY2)"
    mkdir -p "$CACHE/wheels"
    [ -f "$CACHE/wheels/$PIP_WHEEL" ] ||
        python3 -m pip download -q --no-deps -d "$CACHE/wheels" pip==20.3.4 >&2
    printf '%s\n' "$CONSTRAINTS" >"$CACHE/constraints.txt"
    # pip run from inside its wheel cannot build the sdists (wsaccel): unpack it first.
    rm -rf "$CACHE/pip" "$CACHE/site"
    "$PY2" "$CACHE/wheels/$PIP_WHEEL/pip" install -q --disable-pip-version-check \
        --no-warn-script-location --target "$CACHE/pip" "$CACHE/wheels/$PIP_WHEEL" >&2
    PYTHONPATH="$CACHE/pip" "$PY2" -m pip install -q --disable-pip-version-check \
        --no-warn-script-location --target "$CACHE/site" \
        -c "$CACHE/constraints.txt" autobahntestsuite==0.8.2 >&2
    echo "$want" >"$stamp"
}

wstest() {
    # site.addsitedir processes the *-nspkg.pth files (the zope namespace package).
    PYTHONWARNINGS=ignore "$PY2" -c 'import site, sys
site.addsitedir(sys.argv[1])
del sys.argv[1]
sys.argv[0] = "wstest"
from autobahntestsuite.wstest import run
run()' "$CACHE/site" "$@"
}

mkdir -p "$CACHE"
find_python2
install_tool
wstest --autobahnversion >&2 || die "wstest does not start"

# ---------------------------------------------------------------------------------------
# Start the server with a throw-away config.
# ---------------------------------------------------------------------------------------
[ -x "$COURIER_BIN" ] || die "no courier binary at $COURIER_BIN (set COURIER_BIN, or build with cargo build --release)"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/courier-autobahn.XXXXXX")
SERVER_PID=
cleanup() {
    if [ -n "$SERVER_PID" ]; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$CACHE/plugin-cache" && chmod 700 "$CACHE/plugin-cache"
cat >"$WORK/courier.toml" <<EOF
[server]
listen = "127.0.0.1:0"

[runtime]
cache_dir = "$CACHE/plugin-cache"

[storage]
url = "sqlite://$WORK/courier.db"
sqlite_synchronous = "normal"

[auth]
jwt_secret = "autobahn-fuzzing-only-secret-0123456789abcdef"

[gateway]
# The fuzzer sends thousands of frames on one connection; every one is answered.
send_rate_per_sec = 1000000
send_burst = 1000000
EOF

mkfifo "$WORK/stdout"
"$COURIER_BIN" serve --config "$WORK/courier.toml" >"$WORK/stdout" 2>"$WORK/server.log" &
SERVER_PID=$!
exec 3<"$WORK/stdout"
LINE=
read -r -t 120 LINE <&3 || true
# Keep draining stdout so the server never blocks on it.
cat <&3 >/dev/null &
exec 3<&-
case "$LINE" in
listening\ on\ *) ADDR=${LINE#listening on } ;;
*)
    cat "$WORK/server.log" >&2
    die "the server did not say 'listening on ADDR' (got: '$LINE')"
    ;;
esac
say "courier listening on $ADDR (log: $WORK/server.log while it runs)"

TOKEN=$(curl -sS --fail-with-body -X POST -H 'content-type: application/json' \
    -d '{"userId":"autobahn","password":"password-autobahn"}' \
    "http://$ADDR/v1/auth/register" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])') ||
    die "registering the user failed"

rm -rf "$REPORT_DIR" && mkdir -p "$REPORT_DIR"
cat >"$WORK/fuzzingclient.json" <<EOF
{
  "outdir": "$REPORT_DIR",
  "servers": [{"agent": "courier", "url": "ws://$ADDR/v1/ws?deviceId=autobahn&token=$TOKEN"}],
  "cases": $CASES,
  "exclude-cases": $EXCLUDE,
  "exclude-agent-cases": {}
}
EOF

START=$(date +%s)
(cd "$WORK" && wstest -m fuzzingclient -s "$WORK/fuzzingclient.json") >"$REPORT_DIR/wstest.log" 2>&1 || {
    tail -50 "$REPORT_DIR/wstest.log" >&2
    die "wstest failed"
}
say "fuzzingclient took $(($(date +%s) - START)) s; report: $REPORT_DIR/index.html"
kill -0 "$SERVER_PID" 2>/dev/null || { tail -50 "$WORK/server.log" >&2; die "the server died during the run"; }
cp "$WORK/server.log" "$REPORT_DIR/courier-server.log"

set +e
python3 "$HERE/summarize.py" "$REPORT_DIR"
RC=$?
exit $RC
