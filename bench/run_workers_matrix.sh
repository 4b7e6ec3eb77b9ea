#!/bin/bash
# Build first: cargo build --release -p switchyard -p switchyard-bench -p switchyard-demo
# thread vs process pools at sizes 1 and 2, GET /cpu/100 at 4 clients, ROUNDS (3) rounds each of
# DUR (5) s, interleaved. BIN: the directory of the binaries (default target/release).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bench/ready.sh"
BIN=${BIN:-$ROOT/target/release}
ROUNDS=${ROUNDS:-3}
DUR=${DUR:-5}
out=${OUT:-/tmp}/workers_matrix.tsv; : > $out
for round in $(seq "$ROUNDS"); do
 for kind in thread process; do
  for size in 1 2; do
   d=$(mktemp -d); cfg=$d/s.toml
   printf '[[managers]]\nname = "compute"\n[managers.workers]\nkind = "%s"\nsize = %s\n' $kind $size > $cfg
   $BIN/switchyard up -c $cfg --bind 127.0.0.1:0 --runtime-dir $d/rt --ready-file $d/ready.json > $d/log 2>&1 &
   pid=$!
   addr=$(ready_addr $d/ready.json $pid) || { tail -n 20 $d/log >&2; kill $pid 2>/dev/null; exit 1; }
   r=$($BIN/switchyard-load http://$addr -r "GET /cpu/100" -c 4 -d "$DUR" --warmup 1 --json 2>/dev/null | python3 -c 'import json,sys; s=json.load(sys.stdin)["steps"][0]; print(s["rps"], s["latency_ms"]["p50"], s["latency_ms"]["p95"], s["status"]["2xx"], s["requests"])')
   echo -e "$round\t$kind\t$size\t$r" | tee -a $out
   kill -TERM $pid; wait $pid 2>/dev/null; rm -rf $d
  done
 done
done
