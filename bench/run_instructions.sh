#!/bin/bash
# Instructions per GET /noop in each process of the request path, counted by
# callgrind: user-space instructions, the same for the same binary and
# configuration whatever else the host is doing (steal, a neighbour), so a
# change of a few hundred instructions shows where CPU-time slices cannot.
#
#   sudo bench/run_instructions.sh BINARY [VAR=VALUE ...]
#   sudo bench/run_instructions.sh target/release/switchyard SWITCHYARD_TRACING__ENABLED=false
#
# Starts a demo group of BINARY natively (VAR=VALUE in its environment;
# the listener's spin off, its loop would be counted), then has the
# supervisor restart the listener, broker, router and `basics` under
# valgrind: it starts children from its own path, so that path is
# bind-mounted over by a script that runs valgrind (hence root; valgrind
# 3.19 cannot run the supervisor itself, it lacks `pidfd_open`). After a
# warm-up, counters are zeroed, N requests (default 8000) are sent on 8
# keep-alive connections, and each process's count is dumped and divided
# by N. The listener's figure repeats to a few instructions; the others
# move by a few per cent with how requests batch between the hops.
set -euo pipefail
BINARY=$(realpath "$1"); shift
N=${N:-8000}
command -v valgrind >/dev/null || { echo "needs valgrind" >&2; exit 1; }
. "$(dirname "$0")/ready.sh"
WORK=$(mktemp -d /tmp/switchyard-instructions.XXXXXX)
cp "$BINARY" "$WORK/switchyard"
cp "$BINARY" "$WORK/real"
cat > "$WORK/wrap" <<WRAP
#!/bin/sh
exec valgrind --tool=callgrind --callgrind-out-file=$WORK/cg.%p $WORK/real "\$@"
WRAP
chmod +x "$WORK/wrap"
SUP=
cleanup() {
    umount "$WORK/switchyard" 2>/dev/null || true
    [ -n "$SUP" ] && kill "$SUP" 2>/dev/null && wait "$SUP" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
env "$@" SWITCHYARD_LISTENER__PARK_SPIN_US=0 "$WORK/switchyard" up --bind 127.0.0.1:0 \
    --runtime-dir "$WORK/rt" --data-dir "$WORK/data" --ready-file "$WORK/ready.json" \
    > "$WORK/log" 2>&1 &
SUP=$!
ADDR=$(ready_addr "$WORK/ready.json" "$SUP")
mount --bind "$WORK/wrap" "$WORK/switchyard"
role_pid() {
    for p in $(pgrep -P "$SUP"); do
        tr '\0' ' ' < "/proc/$p/cmdline" | grep -q -- "--name $1 " && echo "$p"
    done
    return 0
}
for role in listener broker router basics; do
    kill -9 "$(role_pid "$role")"
    # The next one once this one is back (under valgrind, seconds).
    for _ in $(seq 600); do
        p=$(role_pid "$role")
        [ -n "$p" ] && grep -q valgrind "/proc/$p/cmdline" 2>/dev/null && break
        sleep 0.1
    done
done
for _ in $(seq 600); do
    curl -sf -m 5 "http://$ADDR/noop" >/dev/null 2>&1 && break
    sleep 0.5
done
load() {
    python3 - "$ADDR" "$1" <<'PY'
import http.client, sys, threading
addr, n = sys.argv[1], int(sys.argv[2])
host, port = addr.rsplit(":", 1)
failed = []
def run(k):
    c = http.client.HTTPConnection(host, int(port), timeout=60)
    for _ in range(k):
        c.request("GET", "/noop")
        r = c.getresponse(); r.read()
        if r.status != 200:
            failed.append(r.status)
threads = [threading.Thread(target=run, args=(n // 8,)) for _ in range(8)]
[t.start() for t in threads]; [t.join() for t in threads]
if failed:
    sys.exit(f"{len(failed)} requests failed: {sorted(set(failed))}")
PY
}
load 2000
callgrind_control -z > /dev/null 2>&1
load "$N"
callgrind_control -d > /dev/null 2>&1
echo "instructions per GET /noop (callgrind, $N requests, 8 connections): ${*:-defaults}"
total=0
for role in listener broker router basics; do
    p=$(role_pid "$role")
    for _ in $(seq 100); do [ -s "$WORK/cg.$p.1" ] && break; sleep 0.1; done
    ir=$(awk '/^summary:/{print $2; exit}' "$WORK/cg.$p.1")
    per=$((ir / N))
    total=$((total + per))
    printf '  %-9s %7d\n' "$role" "$per"
done
printf '  %-9s %7d\n' group "$total"
