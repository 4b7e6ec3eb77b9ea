#!/bin/bash
# Build first: cargo build --release -p switchyard -p switchyard-bench -p switchyard-demo-plugin
# GET /noop at 1 and 8 clients: basics linked in (built-in) vs loaded from the cdylib; ROUNDS (3) rounds
# of DUR (4) s per step, interleaved. BIN: the directory of the binaries (default target/release).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bench/ready.sh"
BIN=${BIN:-$ROOT/target/release}
ROUNDS=${ROUNDS:-3}
DUR=${DUR:-4}
SO=$BIN/libswitchyard_demo_plugin.so
out=${OUT:-/tmp}/plugin_vs_static.tsv; : > $out
for round in $(seq "$ROUNDS"); do
 for mode in static plugin; do
   d=$(mktemp -d); cfg=$d/s.toml
   if [ $mode = plugin ]; then printf '[[managers]]\nname = "basics"\nplugin = "%s"\n' $SO > $cfg; else printf '[[managers]]\nname = "basics"\n' > $cfg; fi
   $BIN/switchyard up -c $cfg --bind 127.0.0.1:0 --runtime-dir $d/rt --ready-file $d/ready.json > $d/log 2>&1 &
   pid=$!
   addr=$(ready_addr $d/ready.json $pid) || { tail -n 20 $d/log >&2; kill $pid 2>/dev/null; exit 1; }
   $BIN/switchyard-load http://$addr -r "GET /noop" -c 1,8 -d "$DUR" --warmup 1 --json 2>/dev/null | python3 -c '
import json,sys
for s in json.load(sys.stdin)["steps"]: print("'$round'\t'$mode'\t%d\t%.0f\t%.3f\t%.3f" % (s["concurrency"], s["rps"], s["latency_ms"]["p50"], s["latency_ms"]["p99"]))' | tee -a $out
   kill -TERM $pid; wait $pid 2>/dev/null; rm -rf $d
 done
done
