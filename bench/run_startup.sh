#!/usr/bin/env bash
# Start-up and memory of the zero-configuration group.
#
#   RUNS=7 LOAD_S=3 bench/run_startup.sh
#
# FRESH_DATA=1 gives every run a new data directory (the built-in store
# then creates its schema and fsyncs it on the critical path); by default
# the group uses its default one, as `switchyard up` without flags does.
#
# Per run: a fresh `switchyard up --bind 127.0.0.1:0` with a private runtime
# directory and a ready file. Measured from the spawn: the ready file's
# appearance, then the first 200 on GET /noop (a poll every 1 ms, a fresh
# connection each try). Then the group's memory: every process of the tree
# (supervisor and descendants) idle, and again after `wrk -t1 -c8
# -d${LOAD_S}s GET /payload/1048576`: Pss and Rss from
# /proc/PID/smaps_rollup, threads from /proc/PID/status. The medians, min and
# max over the runs go to stdout; the last run's per-process table too.
#
# SWITCHYARD names the binary (default target/release/switchyard, not built
# here). The machine's load average at each start is printed: other builds
# on the same cores move start-up times by tens of ms.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SWITCHYARD=${SWITCHYARD:-$ROOT/target/release/switchyard}
RUNS=${RUNS:-7}
LOAD_S=${LOAD_S:-3}
FRESH_DATA=${FRESH_DATA:-0}
[[ -x $SWITCHYARD ]] || { echo "run_startup: no binary at $SWITCHYARD (cargo build --release)" >&2; exit 1; }
command -v wrk >/dev/null || { echo "run_startup: wrk is needed" >&2; exit 1; }
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "run_startup: RUNS must be a positive integer" >&2; exit 1; }
[[ $LOAD_S =~ ^[1-9][0-9]*$ ]] || { echo "run_startup: LOAD_S must be a positive integer" >&2; exit 1; }

exec python3 - "$SWITCHYARD" "$RUNS" "$LOAD_S" "$FRESH_DATA" <<'PY'
import json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, time

exe, runs, load_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fresh_data = sys.argv[4] == "1"
READY_TIMEOUT = 30.0

def tree(root):
    parent = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        parent[int(d)] = int(s[s.rindex(")") + 2:].split()[1])
    keep, grew = {root}, True
    while grew:
        grew = False
        for p, pp in parent.items():
            if p not in keep and pp in keep:
                keep.add(p); grew = True
    return sorted(p for p in keep if p in parent)

def proc_info(pid):
    info = {"pid": pid}
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        info["what"] = " ".join(a.decode(errors="replace") for a in argv[1:4] if a)
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem"):
                    info[k] = int(v.split()[0])
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    info["threads"] = int(line.split()[1])
    except OSError:
        return None
    return info

def snapshot(root):
    return [i for i in (proc_info(p) for p in tree(root)) if i and "Pss" in i]

def get(port, path):
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    try:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        head = s.recv(64)
        return head.split(b" ")[1] if head.startswith(b"HTTP/") else b""
    finally:
        s.close()

def one_run():
    tmp = tempfile.mkdtemp(prefix="sy-startup-")
    ready = os.path.join(tmp, "ready.json")
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    argv = [exe, "up", "--bind", "127.0.0.1:0", "--runtime-dir", os.path.join(tmp, "rt"),
            "--ready-file", ready]
    if fresh_data:
        argv += ["--data-dir", os.path.join(tmp, "data")]
    proc = subprocess.Popen(
        argv,
        stdout=open(os.path.join(tmp, "out.log"), "w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        while not os.path.exists(ready):
            if proc.poll() is not None:
                raise SystemExit(f"run_startup: the group exited ({proc.returncode}), see {tmp}/out.log")
            if time.monotonic() - t0 > READY_TIMEOUT:
                raise SystemExit(f"run_startup: not ready in {READY_TIMEOUT} s, see {tmp}/out.log")
            time.sleep(0.001)
        t_ready = time.monotonic() - t0
        port = int(json.load(open(ready))["http"].rsplit(":", 1)[1])
        while True:
            try:
                if get(port, "/noop") == b"200":
                    break
            except OSError:
                pass
            time.sleep(0.001)
        t_200 = time.monotonic() - t0
        time.sleep(1)
        idle = snapshot(proc.pid)
        wrk = subprocess.run(["wrk", "-t1", "-c8", f"-d{load_s}s",
                              f"http://127.0.0.1:{port}/payload/1048576"],
                             capture_output=True, text=True)
        rps = next((l.split()[1] for l in wrk.stdout.splitlines() if l.startswith("Requests/sec")), "?")
        loaded = snapshot(proc.pid)
        return dict(load=load, ready=t_ready * 1e3, first200=t_200 * 1e3, idle=idle,
                    loaded=loaded, rps=rps)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL); proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)

def mib(kib):
    return kib / 1024

results = []
for i in range(runs):
    r = one_run()
    results.append(r)
    print(f"run {i + 1}: load {r['load']:.2f}  ready {r['ready']:.1f} ms  first 200 {r['first200']:.1f} ms  "
          f"processes {len(r['loaded'])}  threads {sum(p.get('threads', 0) for p in r['loaded'])}  "
          f"PSS idle {mib(sum(p['Pss'] for p in r['idle'])):.1f} MiB  after load "
          f"{mib(sum(p['Pss'] for p in r['loaded'])):.1f} MiB  ({r['rps']} req/s)", flush=True)

def line(name, values, unit):
    print(f"{name}: median {statistics.median(values):.1f} {unit}, min {min(values):.1f}, max {max(values):.1f}")

print()
print(f"binary: {exe}; {runs} runs; {'a fresh' if fresh_data else 'the default'} data directory; load average at the starts "
      f"{min(r['load'] for r in results):.2f}-{max(r['load'] for r in results):.2f}")
line("spawn -> ready file", [r["ready"] for r in results], "ms")
line("spawn -> first 200 on /noop", [r["first200"] for r in results], "ms")
line("group PSS idle", [mib(sum(p["Pss"] for p in r["idle"])) for r in results], "MiB")
line("group PSS after the 1 MiB load", [mib(sum(p["Pss"] for p in r["loaded"])) for r in results], "MiB")
line("group RSS after the 1 MiB load", [mib(sum(p["Rss"] for p in r["loaded"])) for r in results], "MiB")
print()
print("last run, per process after the load (KiB):")
print(f"{'pid':>7} {'threads':>7} {'Rss':>8} {'Pss':>8} {'Pss_Anon':>8} {'Pss_File':>8} {'Pss_Shmem':>9}  what")
for p in results[-1]["loaded"]:
    print(f"{p['pid']:>7} {p.get('threads', 0):>7} {p['Rss']:>8} {p['Pss']:>8} {p.get('Pss_Anon', 0):>8} "
          f"{p.get('Pss_File', 0):>8} {p.get('Pss_Shmem', 0):>9}  {p['what']}")
PY
