#!/usr/bin/env python3
"""CPU per request of two builds of the group, side by side, per process.

    bench/run_ab_cpu.py BINARY_A BINARY_B [PAIRS] [CONNS] [SLICE_S] [PATH]
    bench/run_ab_cpu.py /tmp/switchyard-before target/release/switchyard 16 8 2 /noop

Starts one demo group of each build (`switchyard up` on an ephemeral port,
private runtime and data directories), warms both, then runs PAIRS pairs of
`wrk -t1 -cCONNS -dSLICE_S` slices, one per group, alternating which goes
first. Each slice's CPU is the scheduler's own account of every thread of
every process of the group (`/proc/PID/task/TID/schedstat`), divided by the
requests wrk counted in it. Printed per figure (the group, the listener,
broker, router and the `basics` manager that serves GET /noop): each build's
median over the slices, and the median of the per-pair ratios B/A with its
quartiles. Pairs taken a few seconds apart share the machine's speed, so the
ratio resolves a change of a few per cent that two separate `run_rest.sh`
runs cannot on a shared 2-core host; read it with its quartiles.

A build is a command line: "env VAR=1 /path/to/switchyard" works too.
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

A, B = sys.argv[1], sys.argv[2]
PAIRS = int(sys.argv[3]) if len(sys.argv) > 3 else 12
CONNS = int(sys.argv[4]) if len(sys.argv) > 4 else 8
SLICE = sys.argv[5] if len(sys.argv) > 5 else "2"
PATH = sys.argv[6] if len(sys.argv) > 6 else "/noop"
FIGURES = ["group", "listener", "broker", "router", "basics", "req/s"]


def start(tag, command):
    run = f"/tmp/switchyard-ab-{os.getpid()}-{tag}"
    shutil.rmtree(run, ignore_errors=True)
    os.makedirs(run)
    log = open(f"{run}/log", "w")
    proc = subprocess.Popen(
        command.split()
        + ["up", "--bind", "127.0.0.1:0", "--runtime-dir", f"{run}/rt", "--data-dir", f"{run}/data",
           "--ready-file", f"{run}/ready.json"],
        stdout=log, stderr=log)
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"{command} exited before it was ready (log: {run}/log)")
        if os.path.exists(f"{run}/ready.json") and os.path.getsize(f"{run}/ready.json") > 0:
            # Written aside and renamed: whole when it exists.
            return proc, json.load(open(f"{run}/ready.json"))["http"]
        time.sleep(0.1)
    sys.exit(f"{command} not ready after 60 s")


def tree(root):
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def name(pid):
    try:
        argv = open(f"/proc/{pid}/cmdline").read().split("\0")
    except OSError:
        return "?"
    return argv[argv.index("--name") + 1] if "--name" in argv else "supervisor"


def cpu_ns(pid):
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            total += int(open(f"/proc/{pid}/task/{task}/schedstat").read().split()[0])
    except OSError:
        pass
    return total


def measure(proc, addr):
    pids = tree(proc.pid)
    before = {pid: cpu_ns(pid) for pid in pids}
    out = subprocess.run(["wrk", "-t1", f"-c{CONNS}", f"-d{SLICE}s", f"http://{addr}{PATH}"],
                         capture_output=True, text=True, check=True).stdout
    after = {pid: cpu_ns(pid) for pid in pids}
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    figures = {}
    for pid in pids:
        key = name(pid)
        figures[key] = figures.get(key, 0) + (after[pid] - before[pid]) / 1e3 / requests
    figures["group"] = sum(figures.values())
    figures["req/s"] = requests / float(SLICE)
    return figures


groups = {"A": start("a", A), "B": start("b", B)}
try:
    for proc, addr in groups.values():
        subprocess.run(["wrk", "-t1", f"-c{CONNS}", "-d1s", f"http://{addr}{PATH}"], capture_output=True)
    slices = {"A": [], "B": []}
    for i in range(PAIRS):
        for tag in ("A", "B") if i % 2 == 0 else ("B", "A"):
            slices[tag].append(measure(*groups[tag]))
finally:
    for proc, _ in groups.values():
        proc.terminate()
    for proc, _ in groups.values():
        proc.wait()

print(f"A = {A}\nB = {B}\n{PAIRS} pairs of `wrk -t1 -c{CONNS} -d{SLICE}s` on GET {PATH}, alternating; "
      "CPU in µs per request\n")
print("| figure | A median | B median | B/A, median of pairs | quartiles |")
print("|---|---:|---:|---:|---|")
for figure in FIGURES:
    a = [s.get(figure, 0.0) for s in slices["A"]]
    b = [s.get(figure, 0.0) for s in slices["B"]]
    ratios = [y / x for x, y in zip(a, b) if x]
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(f"| {figure} | {statistics.median(a):.1f} | {statistics.median(b):.1f} | "
          f"{statistics.median(ratios):.3f} | {q[0]:.3f}–{q[2]:.3f} |")
