#!/usr/bin/env bash
# REST scenario, side by side: GET /noop (or ROUTES) on `switchyard up` (the full process
# group, four hops each way) and on `switchyard-baseline` (zero hops), in the
# same run, rounds alternating between the two, so that every figure comes
# with its ratio to the baseline measured under the same machine noise.
#
#   RUNS=3 DUR=5 CONNS="1 8 32" OUT=/tmp/switchyard-bench bench/run_rest.sh
#
# ROUTES picks the paths measured (default "/noop"), each at every
# connection count, e.g. ROUTES="/payload/1048576 /payload/1048576?copy=true"
# for a body the manager keeps sealed and the same body copied per response.
#
# SERVERS picks what runs (default "switchyard router baseline"): `switchyard`
# is the group as configured by default (answers straight back to the
# listener, decision 0143), `router` and `direct` the same group with
# `group.return_path` set to that path, `baseline` the in-process hyper
# server. SWITCHYARD names the binary to run for the group (default
# target/release/switchyard, built first), to set two builds side by side.
#
# Per round and server: a fresh server (private runtime and data dirs), a 2 s warm-up, then one wrk run per
# connection count. CPU time per request is the server's whole process tree
# (utime+stime from /proc) over the run divided by the requests wrk counted.
# Raw figures go to $OUT/rest-STAMP.tsv (wrk and server output next to it in
# $OUT/rest-STAMP/); the markdown summary goes to stdout and $OUT/rest-STAMP.md.
set -euo pipefail

RUNS=${RUNS:-3}
DUR=${DUR:-5}
CONNS=${CONNS:-"1 8 32"}
ROUTES=${ROUTES:-/noop}
OUT=${OUT:-/tmp/switchyard-bench}

COMMAND="RUNS=$RUNS DUR=$DUR CONNS=\"$CONNS\" ROUTES=\"$ROUTES\" OUT=$OUT $0${*:+ $*}"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
read -r -a SERVERS <<<"${SERVERS:-switchyard router baseline}"
COMMAND="SERVERS=\"${SERVERS[*]}\" $COMMAND"
SWITCHYARD=${SWITCHYARD:-$ROOT/target/release/switchyard}
COMMAND="SWITCHYARD=$SWITCHYARD $COMMAND"
READY_TIMEOUT_S=30
STOP_TIMEOUT_S=15
WARMUP_S=2

die() { echo "run_rest: $*" >&2; exit 1; }
log() { echo "run_rest: $*" >&2; }

# Dies unless $2 (the value of knob $1) is an integer in $3..$4.
check_int() {
    if ! [[ $2 =~ ^[1-9][0-9]*$ ]] || (($2 < $3 || $2 > $4)); then
        die "$1 must be an integer in $3..$4, not '$2'"
    fi
}
check_int RUNS "$RUNS" 1 50
check_int DUR "$DUR" 1 300
read -r -a CONN_LIST <<<"$CONNS"
((${#CONN_LIST[@]} > 0)) || die "CONNS is empty"
for c in "${CONN_LIST[@]}"; do check_int CONNS "$c" 1 10000; done
read -r -a ROUTE_LIST <<<"$ROUTES"
((${#ROUTE_LIST[@]} > 0)) || die "ROUTES is empty"
for r in "${ROUTE_LIST[@]}"; do [[ $r == /* && $r != *[[:space:]]* ]] || die "a route is a path, not '$r'"; done

# --- servers -----------------------------------------------------------------

# Pids of servers started and not yet stopped, for the exit trap.
declare -A LIVE=()

# PIDs of $1 and all its descendants, from the ppid field of /proc/*/stat.
tree_pids() {
    { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v root="$1" '
        {
            pid = $1
            sub(/^.*\) /, "")   # the command name may hold spaces and parens
            split($0, f, " ")
            parent[pid] = f[2]
        }
        END {
            keep[root] = 1
            do {
                grew = 0
                for (p in parent)
                    if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; grew = 1 }
            } while (grew)
            for (p in keep) if (p in parent) print p
        }'
}

# CPU clock ticks used so far by $1 and its descendants. Children's reaped
# time (cutime+cstime) counts too, so that a child that exits or is
# restarted during a run does not take its ticks with it.
tree_ticks() {
    local -a stats=()
    local pid
    for pid in $(tree_pids "$1"); do stats+=("/proc/$pid/stat"); done
    ((${#stats[@]} > 0)) || { echo 0; return; }
    { cat "${stats[@]}" 2>/dev/null || true; } | awk '
        { sub(/^.*\) /, ""); split($0, f, " "); t += f[12] + f[13] + f[14] + f[15] }
        END { printf "%d\n", t }'
}

# Whether $1 is still running (a zombie is not: it waits to be reaped).
running() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

# Starts server $1 with output under prefix $2; sets PID and ADDR.
start_server() {
    local name=$1 prefix=$2 rtdir=
    local -a cmd
    case $name in
    switchyard | direct | router)
        rtdir=$(mktemp -d)
        cmd=("$SWITCHYARD" up --bind 127.0.0.1:0 --runtime-dir "$rtdir/rt" --data-dir "$rtdir/data" --ready-file "$rtdir/ready.json")
        [[ $name != switchyard ]] && cmd=(env SWITCHYARD_GROUP__RETURN_PATH="$name" "${cmd[@]}")
        ;;
    baseline) cmd=("$ROOT/target/release/switchyard-baseline" --bind 127.0.0.1:0) ;;
    *) die "unknown server $name" ;;
    esac
    # Made here, not by the child's redirection: the readiness loop below
    # may read the file before the child has opened it.
    : >"$prefix.out"
    : >"$prefix.err"
    "${cmd[@]}" >"$prefix.out" 2>"$prefix.err" &
    PID=$!
    LIVE[$PID]=$rtdir
    local deadline=$((SECONDS + READY_TIMEOUT_S))
    ADDR=
    while [[ -z $ADDR ]]; do
        # The group's readiness file (decision 0150); the baseline's line.
        if [[ -n $rtdir ]]; then
            [[ -s $rtdir/ready.json ]] && ADDR=$(sed -n 's|.*"http":"\([0-9.]*:[0-9]*\)".*|\1|p' "$rtdir/ready.json")
        else
            ADDR=$(sed -n 's|.*listening on http://\([0-9.]*:[0-9]*\).*|\1|p' "$prefix.out" | head -n1)
        fi
        [[ -n $ADDR ]] && break
        running "$PID" || { tail -n 20 "$prefix.err" >&2; die "$name exited before it was ready"; }
        ((SECONDS < deadline)) || die "$name not ready after ${READY_TIMEOUT_S}s"
        sleep 0.05
    done
    [[ $ADDR == 127.0.0.1:* ]] || die "$name listens on $ADDR, not on 127.0.0.1"
}

# SIGTERM to $1, a bounded wait, then SIGKILL to whatever of its tree is left.
stop_server() {
    local pid=$1 rc=0 tree
    tree=$(tree_pids "$pid" | tr '\n' ' ')
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT_S))
    while running "$pid" && ((SECONDS < deadline)); do sleep 0.05; done
    if running "$pid"; then
        log "pid $pid ignored SIGTERM for ${STOP_TIMEOUT_S}s; killing it"
        rc=137
    fi
    # Also catches children orphaned by a supervisor that died uncleanly.
    # shellcheck disable=SC2086
    kill -KILL $tree 2>/dev/null || true
    wait "$pid" 2>/dev/null || rc=$?
    [[ -n ${LIVE[$pid]:-} ]] && rm -rf "${LIVE[$pid]}"
    unset "LIVE[$pid]"
    return "$rc"
}

cleanup() {
    local pid
    for pid in "${!LIVE[@]}"; do stop_server "$pid" || true; done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- wrk ---------------------------------------------------------------------

# requests, req/s, p50 ms, p99 ms, socket errors, non-2xx responses; tab-separated.
parse_wrk() {
    awk '
        function ms(v,  n) {
            n = v + 0
            if (v ~ /us$/) return n / 1000
            if (v ~ /ms$/) return n
            if (v ~ /m$/) return n * 60000
            if (v ~ /h$/) return n * 3600000
            if (v ~ /s$/) return n * 1000
            return n
        }
        /requests in/ { requests = $1 }
        /^Requests\/sec:/ { rps = $2 }
        /^ *50% / { p50 = ms($2) }
        /^ *99% / { p99 = ms($2) }
        /Socket errors:/ { gsub(/,/, ""); errors = $4 + $6 + $8 + $10 }
        /Non-2xx or 3xx responses:/ { non2xx = $NF }
        END {
            if (rps == "" || requests == "" || p50 == "" || p99 == "") exit 1
            printf "%d\t%.2f\t%.4f\t%.4f\t%d\t%d\n", requests, rps, p50, p99, errors, non2xx
        }' "$1"
}

# Sets CHILD_CPU_S to the CPU seconds of this shell's reaped children (wrk).
# Called directly, never as $(...): a subshell would count its own children.
children_cpu() {
    times >"$WORK/times"
    CHILD_CPU_S=$(awk 'NR == 2 {
        t = 0
        for (i = 1; i <= 2; i++) { split($i, a, "m"); t += a[1] * 60 + a[2] }
        printf "%.3f\n", t
    }' "$WORK/times")
}

# --- setup -------------------------------------------------------------------

if ! command -v wrk >/dev/null; then
    log "wrk is missing; installing the Debian package"
    sudo=()
    ((EUID == 0)) || sudo=(sudo)
    "${sudo[@]}" apt-get install -y wrk || { "${sudo[@]}" apt-get update && "${sudo[@]}" apt-get install -y wrk; }
fi

# The group's binary is built only when it is this tree's: a SWITCHYARD
# named elsewhere is measured as it is, and a source edited during the run
# must not start a build beside the measurement.
if [[ $SWITCHYARD == "$ROOT/target/release/switchyard" ]]; then
    log "building (release)"
    (cd "$ROOT" && cargo build --release -p switchyard -p switchyard-bench) >&2
else
    log "building the baseline (release); the group is $SWITCHYARD as it is"
    (cd "$ROOT" && cargo build --release -p switchyard-bench --bin switchyard-baseline) >&2
fi

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
WORK="$OUT/rest-$STAMP"
mkdir -p "$WORK"
TSV="$OUT/rest-$STAMP.tsv"
REPORT="$OUT/rest-$STAMP.md"
CLK_TCK=$(getconf CLK_TCK)
printf 'round\tserver\troute\tconns\tduration_s\trequests\trps\tp50_ms\tp99_ms\tsocket_errors\tnon_2xx\tcpu_ticks\tcpu_us_per_req\twrk_cpu_s\n' >"$TSV"

# --- rounds ------------------------------------------------------------------

for ((round = 1; round <= RUNS; round++)); do
    # Rotate the order every round: no server always runs on a warmer machine.
    n=${#SERVERS[@]}
    order=()
    for ((i = 0; i < n; i++)); do order+=("${SERVERS[(i + round - 1) % n]}"); done
    for server in "${order[@]}"; do
        prefix="$WORK/r$round-$server"
        start_server "$server" "$prefix"
        log "round $round/$RUNS: $server (pid $PID) on $ADDR"
        timeout -k 5 $((WARMUP_S + 30)) wrk -t1 -c8 -d${WARMUP_S}s "http://$ADDR${ROUTE_LIST[0]}" >"$prefix-warmup.txt"
        for r in "${!ROUTE_LIST[@]}"; do
        route=${ROUTE_LIST[$r]}
        for c in "${CONN_LIST[@]}"; do
            raw="$prefix-r$r-c$c.txt"
            ticks0=$(tree_ticks "$PID")
            children_cpu
            wrk0=$CHILD_CPU_S
            timeout -k 5 $((DUR + 30)) wrk -t1 -c"$c" -d"${DUR}s" --latency "http://$ADDR$route" >"$raw"
            children_cpu
            wrk1=$CHILD_CPU_S
            ticks1=$(tree_ticks "$PID")
            fields=$(parse_wrk "$raw") || die "cannot parse wrk output $raw"
            read -r requests rps p50 p99 errors non2xx <<<"$fields"
            ((requests > 0)) || die "wrk completed no requests against $server (see $raw)"
            ((errors + non2xx == 0)) || log "warning: $server c=$c: $errors socket errors, $non2xx non-2xx"
            ticks=$((ticks1 - ticks0))
            read -r us_per_req wrk_cpu < <(awk -v t="$ticks" -v hz="$CLK_TCK" -v n="$requests" \
                -v a="$wrk0" -v b="$wrk1" 'BEGIN { printf "%.2f %.3f\n", t / hz * 1e6 / n, b - a }')
            printf '%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n' "$round" "$server" "$route" "$c" "$DUR" \
                "$requests" "$rps" "$p50" "$p99" "$errors" "$non2xx" "$ticks" "$us_per_req" "$wrk_cpu" >>"$TSV"
            log "  $route c=$c: $rps req/s, p50 $p50 ms, p99 $p99 ms, $us_per_req us CPU/req"
        done
        done
        rc=0
        stop_server "$PID" || rc=$?
        ((rc == 0)) || log "warning: $server exited with status $rc (see $prefix.err)"
    done
done

# --- summary -----------------------------------------------------------------

# "median min max" of column $1 over the rounds of server $2 on route $3
# at $4 connections.
stats() {
    awk -F'\t' -v col="$1" -v s="$2" -v r="$3" -v c="$4" '
        NR == 1 { for (i = 1; i <= NF; i++) if ($i == col) f = i; next }
        $2 == s && $3 == r && $4 == c { print $f }' "$TSV" | sort -g | awk '
        { v[NR] = $1 }
        END {
            if (NR == 0) { print "nan nan nan"; exit }
            m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            print m, v[1], v[NR]
        }'
}

cpu_model=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
[[ -n $cpu_model ]] || cpu_model=$(lscpu 2>/dev/null | awk -F': *' '/^Model name/ { print $2; exit }')
wrk_version=$({ wrk -v 2>&1 || true; } | awk 'NR == 1 { print $1, $2 }')
commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || commit="$commit (+ uncommitted changes)"
wrk_max=$(awk -F'\t' -v d="$DUR" 'NR > 1 && $14 / d > m { m = $14 / d } END { printf "%.0f", m * 100 }' "$TSV")
wrk_note=
((wrk_max < 90)) || wrk_note="; at that level the load generator, not the server, may be the limit"

{
    echo "## REST: GET ${ROUTE_LIST[*]}, Switchyard vs in-process hyper baseline"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- machine: $(nproc) cores, ${cpu_model:-unknown CPU}, Linux $(uname -r)"
    echo "- rustc: $(cd "$ROOT" && rustc --version)"
    echo "- wrk: $wrk_version, \`-t1 -c{conns} -d${DUR}s --latency\`, ${WARMUP_S} s warm-up per server and round"
    echo "- commit: $commit"
    echo "- command: \`$COMMAND\`"
    echo "- rounds: $RUNS, alternating; req/s as median (min–max), latency and CPU as medians"
    echo "- raw: $TSV"
    echo
    echo "| server | route | conns | Switchyard req/s | p50 ms | p99 ms | baseline req/s | p50 ms | p99 ms | req/s ratio | Switchyard CPU µs/req | baseline CPU µs/req | CPU ratio |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for server in "${SERVERS[@]}"; do
        [[ $server == baseline ]] && continue
        for route in "${ROUTE_LIST[@]}"; do
        for c in "${CONN_LIST[@]}"; do
            read -r s_rps s_min s_max <<<"$(stats rps "$server" "$route" "$c")"
            read -r s_p50 _ _ <<<"$(stats p50_ms "$server" "$route" "$c")"
            read -r s_p99 _ _ <<<"$(stats p99_ms "$server" "$route" "$c")"
            read -r s_cpu _ _ <<<"$(stats cpu_us_per_req "$server" "$route" "$c")"
            read -r b_rps b_min b_max <<<"$(stats rps baseline "$route" "$c")"
            read -r b_p50 _ _ <<<"$(stats p50_ms baseline "$route" "$c")"
            read -r b_p99 _ _ <<<"$(stats p99_ms baseline "$route" "$c")"
            read -r b_cpu _ _ <<<"$(stats cpu_us_per_req baseline "$route" "$c")"
            awk -v srv="$server" -v route="$route" -v c="$c" -v sr="$s_rps" -v sl="$s_min" -v sh="$s_max" -v s50="$s_p50" -v s99="$s_p99" \
                -v br="$b_rps" -v bl="$b_min" -v bh="$b_max" -v b50="$b_p50" -v b99="$b_p99" \
                -v sc="$s_cpu" -v bc="$b_cpu" 'BEGIN {
                    printf "| %s | %s | %d | %.0f (%.0f–%.0f) | %.3f | %.3f | %.0f (%.0f–%.0f) | %.3f | %.3f | %.3f | %.1f | %.1f | %.2f |\n",
                        srv, route, c, sr, sl, sh, s50, s99, br, bl, bh, b50, b99, (br > 0 ? sr / br : 0), sc, bc, (bc > 0 ? sc / bc : 0)
                }'
        done
        done
    done
    echo
    echo "Ratios are Switchyard / baseline: req/s below 1 and CPU above 1 are the cost of the hops."
    echo "wrk itself used at most ${wrk_max}% of one core in any run$wrk_note."
} | tee "$REPORT"
