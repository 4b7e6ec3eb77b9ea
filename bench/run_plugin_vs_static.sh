#!/bin/bash
# Build first: cargo build --release -p switchyard -p switchyard-bench -p switchyard-demo-plugin
# GET /noop at 1 and 8 clients: basics linked in (built-in) vs loaded from the cdylib; 3 rounds, interleaved
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-$ROOT/target/release}
SO=$BIN/libswitchyard_demo_plugin.so
out=${OUT:-/tmp}/plugin_vs_static.tsv; : > $out
for round in 1 2 3; do
 for mode in static plugin; do
   d=$(mktemp -d); cfg=$d/s.toml
   if [ $mode = plugin ]; then printf '[[managers]]\nname = "basics"\nplugin = "%s"\n' $SO > $cfg; else printf '[[managers]]\nname = "basics"\n' > $cfg; fi
   $BIN/switchyard up -c $cfg --bind 127.0.0.1:0 --runtime-dir $d/rt > $d/log 2>&1 &
   pid=$!
   for i in $(seq 100); do grep -q "listening on" $d/log && break; sleep 0.1; done
   addr=$(grep -o 'http://[0-9.:]*' $d/log | head -1)
   $BIN/switchyard-load $addr -r "GET /noop" -c 1,8 -d 4 --warmup 1 --json 2>/dev/null | python3 -c '
import json,sys
for s in json.load(sys.stdin)["steps"]: print("'$round'\t'$mode'\t%d\t%.0f\t%.3f\t%.3f" % (s["concurrency"], s["rps"], s["latency_ms"]["p50"], s["latency_ms"]["p99"]))' | tee -a $out
   kill -TERM $pid; wait $pid 2>/dev/null; rm -rf $d
 done
done
