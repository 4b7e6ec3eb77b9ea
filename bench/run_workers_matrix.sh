#!/bin/bash
# Build first: cargo build --release -p switchyard -p switchyard-bench -p switchyard-demo
# thread vs process pools at sizes 1 and 2, GET /cpu/100 at 4 clients, 3 rounds each, interleaved
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-$ROOT/target/release}
out=${OUT:-/tmp}/workers_matrix.tsv; : > $out
for round in 1 2 3; do
 for kind in thread process; do
  for size in 1 2; do
   d=$(mktemp -d); cfg=$d/s.toml
   printf '[[managers]]\nname = "compute"\n[managers.workers]\nkind = "%s"\nsize = %s\n' $kind $size > $cfg
   $BIN/switchyard up -c $cfg --bind 127.0.0.1:0 --runtime-dir $d/rt > $d/log 2>&1 &
   pid=$!
   for i in $(seq 100); do grep -q "listening on" $d/log && break; sleep 0.1; done
   addr=$(grep -o 'http://[0-9.:]*' $d/log | head -1)
   r=$($BIN/switchyard-load $addr -r "GET /cpu/100" -c 4 -d 5 --warmup 1 --json 2>/dev/null | python3 -c 'import json,sys; s=json.load(sys.stdin)["steps"][0]; print(s["rps"], s["latency_ms"]["p50"], s["latency_ms"]["p95"], s["status"]["2xx"], s["requests"])')
   echo -e "$round\t$kind\t$size\t$r" | tee -a $out
   kill -TERM $pid; wait $pid 2>/dev/null; rm -rf $d
  done
 done
done
