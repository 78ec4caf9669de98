"""Start-up figures on the test cluster, for bench/cluster.sh (which sets KUBECONFIG and PATH).

Measurements from the outside, as a user sees it:
  cold    `kubectl apply` of a new Goless sample -> first 200, the build cache emptied first
          (the node directory of the operator's default --build-cache, this node's);
  apply   the same for REPS other new Functions, the build cache warm (the median run);
  edit    a new answer in the handler of one of them -> the Service answers with it (REPS
          edits, the median run);
  revert  the handler back as it was -> the old answer again (a cache hit: nothing compiles);
each with the builder's phases (its result line, in the build pod's termination message);
  pod     a new pod of an already-built Function: created -> scheduled -> sandbox (pod IP)
          -> container running -> Ready -> first 200 from the pod;
  goless  the same new pod, done Goless's way: an init container runs `go build` of the
          Goless sample (the builder image's Go, an empty GOCACHE), then the binary serves;
  zero    time to first byte of the first request to a Function with `scale.min: 0` (no pod
          of its own: the namespace's pool loads it on that request), against the same
          request to the warm pod of bench-hello and to a Function the pool has loaded.
Polls every 20 ms, so each phase is known to about that; Kubernetes' own timestamps are
whole seconds and are not used. Writes its section of docs/benchmarks.md, and prints the
raw figures as JSON on stderr.
"""

import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

NS = "wasmless-bench"
POLL = 0.02

GOLESS_HANDLER = """package handlers

import (
\t"net/http"
)

func Handler(w http.ResponseWriter, r *http.Request) {
\tw.Write([]byte("This works!"))
}
"""

GOLESS_MAIN = """package main

import (
\t"function/handlers"
\t"net/http"
)

func main() {
\thttp.HandleFunc("/", handlers.Handler)
\thttp.ListenAndServe(":8080", nil)
}
"""


def kubectl(*args, stdin=None, check=True):
    result = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def get_json(*args):
    out = kubectl(*args, "-o", "json", check=False)
    return json.loads(out) if out.strip() else None


def http_ok(url):
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except Exception:
        return False


def wait(what, predicate, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(POLL)
    raise SystemExit(f"{what}: not within {seconds} s")


BUILD_CACHE = "/var/lib/wasmless/builds"


def function_yaml(name, marker, body="This works!"):
    source = GOLESS_HANDLER.replace("This works!", body) + f"\n// {marker}\n"
    return json.dumps({
        "apiVersion": "wasmless.io/v1alpha1",
        "kind": "Function",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"function": source, "serverPort": 8080},
    })


def http_body(url):
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.read().decode() if response.status == 200 else None
    except Exception:
        return None


def empty_build_cache():
    """Empties the node's build cache (this script runs on the node, as root)."""
    subprocess.run(["find", BUILD_CACHE, "-mindepth", "1", "-delete"], check=False)


def build_phases(name, jobs_before=()):
    """The builder's phases and cache answers for the newest build Job of `name`, from its
    result line (the pod's termination message), plus Job created -> builder started. The
    answer can come before the kubelet reports the builder's exit (the pods are switched to
    the build as soon as its chunks are written): a new Job's result is waited for."""
    deadline = time.monotonic() + 60
    while True:
        jobs = [j for j in get_json("get", "jobs", "-n", NS, "-l", f"wasmless.io/function={name}")["items"]
                if j["metadata"]["name"] not in jobs_before]
        if not jobs:
            return {}
        job = max(jobs, key=lambda j: j["metadata"]["creationTimestamp"])
        phases = job_result(job)
        if phases or time.monotonic() > deadline:
            return phases
        time.sleep(0.5)


def median_run(runs, key):
    """The run whose `key` is the median of `runs` (the lower middle of an even count)."""
    ordered = sorted(runs, key=lambda run: run[key])
    return ordered[(len(ordered) - 1) // 2]


def job_result(job):
    pods = get_json("get", "pods", "-n", NS, "-l", f"batch.kubernetes.io/job-name={job['metadata']['name']}")
    for pod in (pods or {}).get("items", []):
        status_of = pod.get("status") or {}
        # The build's steps: prepare-cache and the compile step (init containers), then the
        # publish step, whose termination message is the result line.
        steps = status_of.get("initContainerStatuses", []) + status_of.get("containerStatuses", [])
        starts = [((s.get("state") or {}).get("terminated") or {}).get("startedAt") for s in steps]
        for status in status_of.get("containerStatuses", []):
            terminated = (status.get("state") or {}).get("terminated") or {}
            lines = [l for l in (terminated.get("message") or "").splitlines() if l.startswith("{")]
            if not lines:
                continue
            result = json.loads(lines[-1])
            phases = dict(result.get("phases", {}))
            phases["cache"] = result.get("cache", {})
            created = job["metadata"]["creationTimestamp"]
            started = min((s for s in starts if s), default=None)
            if started:
                phases["job_to_builder_started"] = (parse_time(started) - parse_time(created))
            return phases
    return {}


def parse_time(text):
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))


def edit_to_new_answer(name, body, url, marker="bench"):
    """A new answer in the handler of a serving Function -> the Service answers with it."""
    jobs_before = {j["metadata"]["name"] for j in get_json("get", "jobs", "-n", NS)["items"]}
    started = time.monotonic()
    kubectl("apply", "-f", "-", stdin=function_yaml(name, marker, body))
    wait("the new answer", lambda: http_body(url) == body, 900)
    marks = {"new_answer": time.monotonic() - started}
    marks["phases"] = build_phases(name, jobs_before)
    return marks


def apply_to_first_200(name, body="This works!"):
    """kubectl apply of a Function never built before -> first 200 through its Service.

    The first 200 is polled on its own thread from the moment the Service exists, and the
    Kubernetes milestones (Job created and complete, a pod Ready) on this one, so that no
    milestone's wait delays the first 200's: its pods start during the build and may answer
    before the Job is counted complete."""
    started = time.monotonic()
    marker = f"bench {time.time()}"
    kubectl("apply", "-f", "-", stdin=function_yaml(name, marker, body))
    marks = {"marker": marker, "name": name}
    answered = threading.Event()

    def service_url():
        svc = get_json("get", "svc", name, "-n", NS)
        return svc and f"http://{svc['spec']['clusterIP']}:8080/"

    def first_200():
        url = wait("the Service", service_url, 900)
        marks["url"] = url
        wait("the first 200", lambda: http_ok(url), 900)
        marks["first_200"] = time.monotonic() - started
        answered.set()

    poller = threading.Thread(target=first_200, daemon=True)
    poller.start()

    def milestones():
        jobs = get_json("get", "jobs", "-n", NS, "-l", f"wasmless.io/function={name}")
        items = jobs["items"] if jobs else []
        now = time.monotonic() - started
        if items and "build_started" not in marks:
            marks["build_started"] = now
        if "built" not in marks and any(c["type"] == "Complete" and c["status"] == "True"
                                        for j in items for c in (j.get("status") or {}).get("conditions", [])):
            marks["built"] = now
        if "pod_ready" not in marks:
            pods = get_json("get", "pods", "-n", NS, "-l", f"wasmless.io/function={name},wasmless.io/component=runtime")
            if any(c["type"] == "Ready" and c["status"] == "True"
                   for p in (pods or {}).get("items", []) for c in (p.get("status") or {}).get("conditions", [])):
                marks["pod_ready"] = time.monotonic() - started
        return answered.is_set() and all(key in marks for key in ("built", "pod_ready"))

    wait("the build, a ready pod and the first 200", milestones, 900)
    poller.join()
    marks["phases"] = build_phases(name)
    return marks


def new_pod(selector, port, timeout):
    """Deletes the one pod matching `selector` and times its replacement, phase by phase."""
    old = {p["metadata"]["name"] for p in get_json("get", "pods", "-n", NS, "-l", selector)["items"]}
    kubectl("delete", "pods", "-n", NS, "-l", selector, "--wait=false")
    started = time.monotonic()
    marks = {}
    pod = None
    deadline = started + timeout
    while time.monotonic() < deadline:
        pods = [p for p in get_json("get", "pods", "-n", NS, "-l", selector)["items"]
                if p["metadata"]["name"] not in old]
        if pods:
            pod = pods[0]
            now = time.monotonic() - started
            marks.setdefault("created", now)
            status = pod.get("status") or {}
            if pod["spec"].get("nodeName"):
                marks.setdefault("scheduled", now)
            if status.get("podIP"):
                marks.setdefault("sandbox", now)
            if any("running" in (c.get("state") or {}) for c in status.get("containerStatuses", [])):
                marks.setdefault("running", now)
            if any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])):
                marks.setdefault("ready", now)
            if status.get("podIP") and "running" in marks and http_ok(f"http://{status['podIP']}:{port}/"):
                marks["first_200"] = time.monotonic() - started
                marks.setdefault("ready", marks["first_200"])
                load, from_store = module_load(status["podIP"])
                if load is not None:
                    marks["module_load"] = load
                marks["from_store"] = from_store
                break
        time.sleep(POLL)
    else:
        raise SystemExit(f"no answer from a new pod of {selector} within {timeout} s")
    return marks


def module_load(pod_ip):
    """What the runtime itself measured for loading the module (wasmless_module_load_seconds),
    and whether the node's code store handed it the compiled code (1) or not (0)."""
    seconds, found, put = None, 0.0, 0.0
    try:
        with urllib.request.urlopen(f"http://{pod_ip}:9090/metrics", timeout=1) as response:
            for line in response.read().decode().splitlines():
                value = line.rsplit(" ", 1)[-1]
                if line.startswith("wasmless_module_load_seconds"):
                    seconds = float(value)
                if line.startswith("wasmless_code_store_requests_total{") and 'result="found"' in line:
                    found += float(value)
                if line.startswith("wasmless_code_store_requests_total{") and 'result="stored"' in line:
                    put += float(value)
    except Exception:
        pass
    # A pod that put the code maps the store's copy after (found too): it read it first.
    return seconds, int(found > 0 and put == 0)


def goless_deployment(builder_image):
    files = {"go.mod": "module function\n\ngo 1.21\n", "main.go": GOLESS_MAIN, "handler.go": GOLESS_HANDLER}
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "goless-src", "namespace": NS},
                 "data": files}
    build = ("mkdir -p /build/handlers && cp /src/go.mod /src/main.go /build/ && "
             "cp /src/handler.go /build/handlers/ && cd /build && go build -o /out/server .")
    security = {"runAsNonRoot": True, "runAsUser": 65532, "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    env = [{"name": "HOME", "value": "/tmp"}, {"name": "GOCACHE", "value": "/tmp/go-cache"},
           {"name": "GOFLAGS", "value": "-mod=mod"}, {"name": "GOPROXY", "value": "off"},
           {"name": "CGO_ENABLED", "value": "0"}]
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "goless", "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "goless"}},
            "template": {
                "metadata": {"labels": {"app": "goless"}},
                "spec": {
                    "initContainers": [{
                        "name": "go-build", "image": builder_image, "command": ["/bin/sh", "-c", build],
                        "env": env, "securityContext": security,
                        "volumeMounts": [{"name": "src", "mountPath": "/src"}, {"name": "out", "mountPath": "/out"},
                                         {"name": "tmp", "mountPath": "/tmp"}, {"name": "build", "mountPath": "/build"}],
                    }],
                    "containers": [{
                        "name": "server", "image": builder_image, "command": ["/out/server"],
                        "securityContext": security,
                        "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
                        "volumeMounts": [{"name": "out", "mountPath": "/out"}],
                    }],
                    "volumes": [{"name": "src", "configMap": {"name": "goless-src"}},
                                {"name": "out", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}},
                                {"name": "build", "emptyDir": {}}],
                },
            },
        },
    }
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [configmap, deployment]})


def ttfb(url):
    """Seconds from opening the connection to the response's status line and headers (a new
    connection each time, as a first request has), and the body."""
    import http.client
    import urllib.parse
    parts = urllib.parse.urlsplit(url)
    started = time.perf_counter()
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    connection.request("GET", parts.path or "/")
    response = connection.getresponse()
    first_byte = time.perf_counter() - started
    body = response.read().decode()
    connection.close()
    if response.status != 200:
        raise SystemExit(f"GET {url}: {response.status} {body}")
    return first_byte, body


def accepts_connections(url):
    """Whether the Service's ClusterIP takes a TCP connection: kube-proxy programs a new Service a
    moment after the Function is Ready, and until then it is refused. No request is sent, so the
    pool loads nothing."""
    import socket
    import urllib.parse
    parts = urllib.parse.urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port), timeout=1).close()
        return True
    except OSError:
        return False


def service_url(name):
    out = kubectl("get", "svc", name, "-n", NS, "-o", "jsonpath={.spec.clusterIP}:{.spec.ports[0].port}")
    return f"http://{out}/"


def from_zero(reps):
    """New Functions with scale.min 0 (one source, so later builds are cache hits): each one's
    first request after Ready, answered by the pool, which loads the module and its code on
    it; then requests it has loaded."""
    first, loaded = [], []
    for index in range(reps):
        name = f"bench-zero-{index}"
        spec = json.loads(function_yaml(name, "zero", "from zero"))
        spec["spec"]["scale"] = {"min": 0, "max": 1}
        kubectl("apply", "-f", "-", stdin=json.dumps(spec))
        wait(f"{name} Ready", lambda: kubectl(
            "get", "fn", name, "-n", NS, "-o", "jsonpath={.status.phase}/{.status.servedBy}", check=False) == "Ready/pool", 600)
        url = service_url(name)
        wait(f"{name}'s Service to be programmed", lambda: accepts_connections(url), 30)
        seconds_to_first_byte, body = ttfb(url)
        if body != "from zero":
            raise SystemExit(f"{name} answered {body!r}")
        first.append(seconds_to_first_byte)
        loaded.extend(ttfb(url)[0] for _ in range(10))
    return {"first": statistics.median(first), "first_max": max(first), "loaded": statistics.median(loaded),
            "count": reps, "firsts": first}


def median_marks(runs):
    keys = runs[0].keys()
    return {k: statistics.median(r[k] for r in runs) for k in keys if all(k in r for r in runs)}


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    builder_image = sys.argv[2] if len(sys.argv) > 2 else "wasmless/builder:0.1.0"
    kubectl("create", "namespace", NS, check=False)
    results = {"reps": reps}

    empty_build_cache()
    results["cold"] = apply_to_first_200(f"bench-cold-{int(time.time())}", "cold cache")
    # New Functions: each source differs (a comment and its answer), the cache is warm. The
    # median of `reps` of each, and each one's figure beside it.
    applies = [apply_to_first_200(f"bench-{int(time.time())}-{i}") for i in range(reps)]
    results["apply_runs"] = [run["first_200"] for run in applies]
    results["apply"] = median_run(applies, "first_200")
    name = results["apply"]["name"]
    url = results["apply"]["url"]
    edits = [edit_to_new_answer(name, f"edited {int(time.time())} {i}", url) for i in range(reps)]
    results["edit_runs"] = [run["new_answer"] for run in edits]
    results["edit"] = median_run(edits, "new_answer")
    results["revert"] = edit_to_new_answer(name, "This works!", url, results["apply"]["marker"])
    print(json.dumps(results), file=sys.stderr)  # the builds, should a later part fail
    name = "bench-hello"
    kubectl("apply", "-f", "-", stdin=function_yaml(name, "bench"))
    wait("bench-hello Ready", lambda: "True" == kubectl(
        "get", "fn", name, "-n", NS, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}", check=False), 900)
    selector = f"wasmless.io/function={name},wasmless.io/component=runtime"
    pods = [new_pod(selector, 8080, 120) for _ in range(reps)]
    results["pod"] = median_marks(pods)
    results["pod_from_store"] = sum(run["from_store"] for run in pods)

    warm_url = service_url(name)
    results["warm_pod"] = statistics.median(ttfb(warm_url)[0] for _ in range(30))
    results["zero"] = from_zero(max(reps, 5))

    kubectl("apply", "-f", "-", stdin=goless_deployment(builder_image))
    kubectl("rollout", "status", "deploy/goless", "-n", NS, "--timeout=600s")
    results["goless"] = median_marks([new_pod("app=goless", 8080, 600) for _ in range(reps)])
    kubectl("delete", "namespace", NS, "--wait=false")
    print(json.dumps(results), file=sys.stderr)
    write_section(PAGE, markdown(results))
    print(f"wrote the cluster section of {PAGE}")


PAGE = "docs/benchmarks.md"
# bench/src/report.rs keeps what stands between these when bench/run.sh rewrites the page.
BEGIN, END = "<!-- bench/cluster.sh begin -->", "<!-- bench/cluster.sh end -->"


def write_section(path, section):
    page = open(path).read()
    block = f"{BEGIN}\n{section}\n{END}"
    if BEGIN in page and END in page:
        page = page[:page.index(BEGIN)] + block + page[page.index(END) + len(END):]
    else:
        page = page.rstrip("\n") + "\n\n" + block + "\n"
    open(path, "w").write(page)


def seconds(value):
    return f"{value:.2f} s"


def phases(marks):
    """Where the time of a new pod goes, phase by phase."""
    order = [("created", "the ReplicaSet creates the pod"), ("scheduled", "scheduled"),
             ("sandbox", "sandbox and network (pod IP)"), ("running", "container started"),
             ("first_200", "first 200")]
    rows, previous = [], 0.0
    for key, label in order:
        if key in marks:
            rows.append(f"| {label} | {seconds(marks[key])} | +{marks[key] - previous:.2f} s |")
            previous = marks[key]
    return "\n".join(rows)


def build_row(label, marks, total_key):
    p = marks.get("phases") or {}
    if not p:
        # No build Job at all: the source is a kept revision's, whose module is still stored.
        return f"| {label} | **{seconds(marks[total_key])}** | no Job: a kept revision's stored module |||||||"
    cache = p.get("cache") or {}
    waited = p.get("job_to_builder_started")
    return (f"| {label} | **{seconds(marks[total_key])}** | "
            f"{'' if waited is None else f'{waited:.0f} s'} | {p.get('compile', 0):.2f} | {p.get('snapshot', 0):.2f} | "
            f"{p.get('precompile', 0):.2f} | {p.get('publish', 0):.2f} | {p.get('total', 0):.2f} | "
            f"{cache.get('module', '?')} / {cache.get('code', '?')} |")


def zero_section(results):
    zero, warm = results.get("zero"), results.get("warm_pod")
    if not zero:
        return ""
    ms = lambda value: f"{value * 1000:.1f} ms"
    return f"""

**From zero** (`scale.min: 0`, issue 24): a Function with no pod of its own is served by its
namespace's pool, which fetches the module and compiled code from the API and loads them on
the Function's first request. Time to first byte over a new connection through the Service,
from the node (medians; {zero["count"]} new Functions of the Goless sample, one first request each):

| request | time to first byte |
|---|---|
| the first request to a Function with no pod of its own (the pool loads it) | **{ms(zero["first"])}** (worst of {zero["count"]}: {ms(zero["first_max"])}) |
| a later request to it (loaded in the pool) | {ms(zero["loaded"])} |
| the same request to bench-hello's warm pod of its own | {ms(warm)} |

From zero costs **{zero["first"] / warm:.1f}×** a warm pod's request here. Knative's activator
waits for a pod to start (a pod's time to Ready was 3.1 s on average on a CI cluster,
knative/serving#11956), and Fission's pool manager reports "about 100msec" for loading a
function into a warm generic pod (fission/fission README): theirs are their own clusters'
figures, not measured here, and Fission's is a whole pod specialised per function, where the
pool here is one process for all of a namespace's Functions."""


def runs(figures):
    """`a, b, c s`, in the order measured."""
    return ", ".join(f"{figure:.2f}" for figure in figures or []) + " s"


def code_from(results):
    """Where the new pods' compiled code came from."""
    hits, reps = results.get("pod_from_store", 0), results["reps"]
    if hits == 0:
        return "reading the builder's compiled code from its ConfigMaps (no node code store on this cluster)"
    return (f"mapping the node's verified copy of the builder's compiled code, handed over by the node "
            f"agent's code store ({hits} of {reps} new pods; `scripts/cluster.sh node-agent` installs it)")


def markdown(results):
    apply, pod, goless = results["apply"], results["pod"], results["goless"]
    cold, edit, revert = results["cold"], results["edit"], results["revert"]
    return f"""## On a cluster: from `kubectl apply`, and a new pod, to the first 200

Measured by `bench/cluster.sh` on the test cluster of `scripts/cluster.sh` (one node, the
same 2 cores), polling every 20 ms from the node. Medians of {results["reps"]} new pods.

**Builds, with the warm builder** (the operator's default `--build-cache
hostPath:/var/lib/wasmless/builds`): from `kubectl apply` to the Service's answer, with
the builder's own phases from its result line (seconds; the wait from the Job's creation to
the builder's start is from Kubernetes' whole-second timestamps). The first build and the
revert are one run each; a new Function and an edit are the median run of
{len(results.get("apply_runs", [0]))} (each a new source), whose figures were
{runs(results.get("apply_runs"))} and {runs(results.get("edit_runs"))}.

| from `kubectl apply` | to the answer | Job → builder started | compile | snapshot | precompile | publish | builder total | cache module / code |
|---|---|---|---|---|---|---|---|---|
{build_row("a new Function, the build cache empty (first build on a node)", cold, "first_200")}
{build_row("a new Function, the build cache warm", apply, "first_200")}
{build_row("an edit (a new answer) → the new answer", edit, "new_answer")}
{build_row("a revert to the first source → its answer", revert, "new_answer")}

"Compile" is `go build` (with a warm `GOCACHE`, the standard library for `wasip1` is not
compiled again); "precompile" is Cranelift compiling the module to native code — skipped
when the code cache holds that module for this engine (the same module bytes: a repeat, a
revert, or a source whose change does not change the module, such as a comment).

**A new Function** (the Goless sample, warm cache): `kubectl apply` → build Job
created {seconds(apply.get("build_started", 0))} → **first 200 through the Service
{seconds(apply["first_200"])}**; its pod was Ready at {seconds(apply["pod_ready"])} and the
Job counted complete at {seconds(apply["built"])}. The Function's pod starts while it
builds, waiting (port closed, not ready) behind a Service that sends to it ready or not, so
kube-proxy has its address before the build ends; the operator switches it to the module as
soon as it sees the module's chunks, and it answers once it has loaded them: the first 200
waits neither for the Job controller to count the Job complete (a second or two after the
builder's exit) nor for the pod's readiness probe and kube-proxy after it. Every later pod
starts from the published module.

**A new pod of an already-built Function** (a rollout, a scale-out, a rescheduled pod): the
pod is deleted and the time runs from then; the phases are cumulative, then their own share.

| Wasmless (Goless sample) | at | phase |
|---|---|---|
{phases(pod)}

| Goless's way (init container `go build`, then the binary) | at | phase |
|---|---|---|
{phases(goless)}

The kubelet reports the pod IP and the started container in one status update, a little
after the container really started, so the table cannot split those two. The runtime's own
measure of loading the module (`wasmless_module_load_seconds`) is
**{pod.get("module_load", float("nan")) * 1000:.1f} ms**: {code_from(results)}, no Cranelift in the pod.

A new Wasmless pod answers **{goless["first_200"] / pod["first_200"]:.0f}× sooner** than Goless's
({seconds(pod["first_200"])} against {seconds(goless["first_200"])}). Images are already on the
node in both (imported, never pulled). In Goless's pod the time after the sandbox is `go build`
in the init container (an empty `GOCACHE`, as every new Goless pod has); in ours the runtime
starting and loading the module's compiled code.{zero_section(results)}"""


if __name__ == "__main__":
    main()
