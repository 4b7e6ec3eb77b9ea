#!/bin/sh
# A soak with large bodies: starts the demo group (release build), then runs
# h2load (Debian's nghttp2-client) against /payload/{size} in four phases —
# 256 KiB and 1 MiB, each over 100 HTTP/1.1 connections and over 100 h2c
# connections with 4 streams each — and samples the whole group's PSS
# (every process's /proc/PID/smaps_rollup) between and during them. Prints
# each phase's h2load summary and status codes, and the PSS samples.
#
#   bench/run_soak.sh [SECONDS_PER_PHASE]   (default 75: five minutes in all;
#                                            NO_BUILD=1 skips the build)
set -eu
secs=${1:-75}
target=${CARGO_TARGET_DIR:-target}
command -v h2load >/dev/null || { echo "h2load not found: apt-get install nghttp2-client" >&2; exit 1; }
[ -n "${NO_BUILD:-}" ] || cargo build --release -q -p switchyard
dir=$(mktemp -d)
log="$dir/up.log"
"$target/release/switchyard" up --bind 127.0.0.1:0 --runtime-dir "$dir/run" --data-dir "$dir/data" --ready-file "$dir/ready.json" >"$log" 2>&1 &
sup=$!
trap 'kill $sup 2>/dev/null; wait $sup 2>/dev/null; rm -rf "$dir"' EXIT
. "$(dirname "$0")/ready.sh"
addr=$(ready_addr "$dir/ready.json" $sup) || { cat "$log"; exit 1; }

# The group's PSS in MiB: the supervisor and every child it reports.
pss() {
    pids="$sup $("$target/release/switchyard" status --json --runtime-dir "$dir/run" |
        python3 -c 'import json,sys; print(" ".join(str(p["pid"]) for p in json.load(sys.stdin)["processes"] if p.get("pid")))')"
    total=0
    for pid in $pids; do
        kib=$(awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup" 2>/dev/null || echo 0)
        total=$((total + ${kib:-0}))
    done
    echo $((total / 1024))
}

echo "group on $addr; PSS at rest: $(pss) MiB"
curl -s -o /dev/null "http://$addr/payload/1048576"
echo "PSS after one 1 MiB request: $(pss) MiB"
for size in 262144 1048576; do
    for mode in h1 h2c; do
        case $mode in
            h1) flags="--h1 -c 100" ;;
            h2c) flags="-c 100 -m 4" ;;
        esac
        out="$dir/h2load-$size-$mode.txt"
        # shellcheck disable=SC2086
        h2load $flags -D "$secs" --warm-up-time 1 "http://$addr/payload/$size" >"$out" 2>&1 &
        load=$!
        samples=""
        while kill -0 $load 2>/dev/null; do
            samples="$samples $(pss)"
            sleep 15
        done
        wait $load || true
        echo "== /payload/$size, $mode ($flags), ${secs} s"
        grep -E '^finished in|^requests:|^status codes:' "$out"
        echo "PSS during (MiB, every 15 s):$samples; after: $(pss)"
    done
done
sleep 10
echo "PSS 10 s after the last phase: $(pss) MiB"
sleep 30
echo "PSS 40 s after the last phase: $(pss) MiB; by process (KiB):"
"$target/release/switchyard" status --json --runtime-dir "$dir/run" |
    python3 -c 'import json,sys; [print(p["pid"], p["role"], p["name"]) for p in json.load(sys.stdin)["processes"] if p.get("pid")]' |
    while read -r pid role name; do
        echo "  $role $name: $(awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup" 2>/dev/null)"
    done
echo "== the group's warnings and errors"
grep -E 'descriptors|went down|WARN|ERROR' "$log" | head -20 || true
