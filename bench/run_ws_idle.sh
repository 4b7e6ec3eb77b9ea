#!/bin/sh
# What an idle WebSocket connection costs the listener: starts the demo
# group (release build), opens N idle /ws connections, prints the
# listener's RSS before, with them, per connection, and after.
#
#   bench/run_ws_idle.sh [N]        (default 5000; NO_BUILD=1 skips the build)
set -eu
n=${1:-5000}
target=${CARGO_TARGET_DIR:-target}
[ -n "${NO_BUILD:-}" ] || cargo build --release -q -p switchyard -p switchyard-bench
dir=$(mktemp -d)
log="$dir/up.log"
"$target/release/switchyard" up --bind 127.0.0.1:0 --runtime-dir "$dir/run" --data-dir "$dir/data" --ready-file "$dir/ready.json" >"$log" 2>&1 &
sup=$!
trap 'kill $sup 2>/dev/null; wait $sup 2>/dev/null; rm -rf "$dir"' EXIT
. "$(dirname "$0")/ready.sh"
addr=$(ready_addr "$dir/ready.json" $sup) || { cat "$log"; exit 1; }
pid=$("$target/release/switchyard" status --json --runtime-dir "$dir/run" |
    python3 -c 'import json,sys; print(next(p["pid"] for p in json.load(sys.stdin)["processes"] if p["name"]=="listener"))')
"$target/release/switchyard-ws-idle" "ws://$addr/ws" --pid "$pid" --connections "$n"
