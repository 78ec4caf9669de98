#!/usr/bin/env python3
"""The timeline of one `kubectl apply` of a new Goless-sample Function, to its first 200
through the Service: watches (`kubectl get -w`) of Jobs, pods, Deployments, EndpointSlices and
ConfigMaps, the operator's log, and a poll of the Service every 20 ms; each event in seconds
after the apply. Run on the node of the test cluster (scripts/cluster.sh env) with the
operator installed, as bench/cluster.sh leaves it:
  python3 bench/apply_timeline.py NAME [ANSWER]
docs/benchmarks.md's timeline table is one such run."""
import os, subprocess, sys, threading, time, urllib.request
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402  (bench/cluster.py: the Function it applies)
NS = cluster.NS
name = sys.argv[1]; body = sys.argv[2] if len(sys.argv) > 2 else "This works!"
events = []
lock = threading.Lock()
def log(what):
    with lock: events.append((time.time(), what))
procs = []
def watch(kind):
    p = subprocess.Popen(["kubectl", "get", kind, "-n", NS, "-w", "--no-headers", "-o", "wide"], stdout=subprocess.PIPE, text=True)
    procs.append(p)
    for line in p.stdout:
        log(f"{kind:15} {' '.join(line.split())[:150]}")
for k in ["jobs", "pods", "deploy", "endpointslices", "configmaps"]:
    threading.Thread(target=watch, args=(k,), daemon=True).start()
op = subprocess.Popen(["kubectl", "logs", "-f", "-n", "wasmless-system", "deploy/wasmless-operator", "--since=1s"], stdout=subprocess.PIPE, text=True)
procs.append(op)
def oplog():
    for line in op.stdout: log("operator        " + line.strip()[:200])
threading.Thread(target=oplog, daemon=True).start()
subprocess.run(["kubectl", "create", "ns", NS], capture_output=True)
time.sleep(2)
t0 = time.time()
subprocess.run(["kubectl", "apply", "-f", "-"], input=cluster.function_yaml(name, f"tl {t0}", body), text=True, check=True, capture_output=True)
log("APPLIED")
url = None
while time.time() - t0 < 60:
    if not url:
        r = subprocess.run(["kubectl", "get", "svc", name, "-n", NS, "-o", "jsonpath={.spec.clusterIP}"], capture_output=True, text=True)
        if r.returncode == 0 and r.stdout: url = f"http://{r.stdout}:8080/"; log("service " + url)
        else: time.sleep(0.05); continue
    try:
        b = urllib.request.urlopen(url, timeout=1).read().decode()
        if b == body: log("ANSWER " + b); break
    except Exception as e: pass
    time.sleep(0.02)
time.sleep(1)
for p in procs: p.kill()
for t, what in sorted(events):
    print(f"{t - t0:7.3f} {what}")
