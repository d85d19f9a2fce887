#!/usr/bin/env bash
# Runs schemathesis against a live `courier serve` on loopback (SQLite in a temp dir) with the
# server's own /v1/openapi.json: no 5xx, every answer's status documented and its body of
# the documented schema. User endpoints get a registered user's token, /admin/* the admin
# token (schemathesis matches them to the document's `userToken` and `adminToken`).
#
#   scripts/schemathesis.sh [extra `st run` options]
#
# Needs schemathesis (`.ci/run` installs it) and a release build of `courier` (built here
# when missing). MAX_EXAMPLES and MAX_TIME bound each of its two runs (defaults: 30 cases
# per operation, at most 120 s). KEEP=1 keeps the temp dir (the server's log).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRA=("$@")

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/courier-ci/target}"
BIN="$CARGO_TARGET_DIR/release/courier"
[ -x "$BIN" ] || cargo build --release -p courier --bin courier

WORK="$(mktemp -d)"
SERVER_PID=
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    if [ -n "${KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

ADMIN_TOKEN="schemathesis-admin-$RANDOM$RANDOM$RANDOM"
cat >"$WORK/courier.toml" <<EOF
[server]
listen = "127.0.0.1:0"
admin_token = "$ADMIN_TOKEN"
[storage]
url = "sqlite://$WORK/courier.db?mode=rwc"
[auth]
# Every case comes from 127.0.0.1: without this, most logins and registrations would only
# test the 429.
attempts_per_minute_per_address = 0
jwt_secret = "schemathesis-secret-$RANDOM$RANDOM$RANDOM$RANDOM"
[runtime]
cache_dir = "$WORK/plugin-cache"
EOF

# Only this config speaks: no COURIER_* settings from the environment.
for v in $(compgen -e | grep '^COURIER_' || true); do unset "$v"; done
"$BIN" serve --config "$WORK/courier.toml" >"$WORK/stdout" 2>"$WORK/server.log" &
SERVER_PID=$!
for _ in $(seq 1 600); do
    grep -q '^listening on ' "$WORK/stdout" 2>/dev/null && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.log"; echo "courier did not start" >&2; exit 1; }
    sleep 0.1
done
ADDR="$(sed -n 's/^listening on //p' "$WORK/stdout" | head -n1)"
[ -n "$ADDR" ] || { cat "$WORK/server.log"; echo "courier did not say where it listens" >&2; exit 1; }
BASE="http://$ADDR"

USER_TOKEN="$(curl -fsS -X POST "$BASE/v1/auth/register" -H 'Content-Type: application/json' \
    -d '{"userId": "schemathesis", "password": "schemathesis-password"}' |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])')"

cat >"$WORK/schemathesis.toml" <<EOF
[auth.openapi.userToken]
bearer = "$USER_TOKEN"
[auth.openapi.adminToken]
bearer = "$ADMIN_TOKEN"
EOF

# Two runs. The first leaves out what ends the user's token, after which every case would
# only test the 401: logout and revoke-all of the caller, and the admin's endpoints on a
# user (schemathesis finds the user's id in the answers: a revoke-all or a deletion of it).
# The second runs those admin endpoints.
# Inside the temp dir: schemathesis and hypothesis keep their caches in the working dir.
run() {
    (cd "$WORK" && st --config-file "$WORK/schemathesis.toml" run "$BASE/v1/openapi.json" \
        --checks not_a_server_error,status_code_conformance,response_schema_conformance \
        --max-examples "${MAX_EXAMPLES:-30}" --max-time "${MAX_TIME:-120}" \
        --workers 1 --seed "${SEED:-1}" --request-timeout 20 --no-color "$@")
}
echo "== schemathesis against $BASE"
status=0
run --exclude-path /v1/auth/logout --exclude-path /v1/auth/revoke-all \
    --exclude-path-regex '^/admin/users/' "${EXTRA[@]}" || status=$?
echo "== schemathesis: /admin/users/*"
run --include-path-regex '^/admin/users/' "${EXTRA[@]}" || status=$?
if [ "$status" -ne 0 ]; then
    echo "== the server's log (last 60 lines)"
    tail -n 60 "$WORK/server.log"
fi
exit "$status"
