"""The likely cause of a failed e2e step, in a few lines: each Function's phase and the
conditions that say something, the pods that are not ready and why, and what each pool
pod says of the Functions it holds.

    python3 e2e/in_brief.py NAMESPACE

CI keeps only the head and the tail of a failed run's output: these lines come first."""

import json
import re
import subprocess
import sys
import urllib.request

ADMIN_PORT = 9090


def kubectl(*args):
    done = subprocess.run(["kubectl", *args], capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()[:200]}")
    return done.stdout


def functions(namespace):
    for fn in json.loads(kubectl("get", "fn", "-n", namespace, "-o", "json"))["items"]:
        status = fn.get("status", {})
        print(f"{fn['metadata']['name']}: {status.get('phase')}, served by {status.get('servedBy')}, "
              f"{status.get('readyReplicas', 0)} ready")
        for condition in status.get("conditions", []):
            if condition.get("status") != "True" or condition["type"] == "Ready":
                print(f"  {condition['type']}={condition['status']} {condition.get('reason', '')}: "
                      f"{condition.get('message', '')[:300]}")


def ready(pod):
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def pods(namespace):
    """The pods that are not ready (and not done), why, and their last log lines; the ready
    pool pods' names."""
    pool = []
    for pod in json.loads(kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"]:
        name, status = pod["metadata"]["name"], pod.get("status", {})
        if pod["metadata"].get("labels", {}).get("wasmless.io/component") == "pool" and ready(pod):
            pool.append(name)
        if ready(pod) or status.get("phase") in ("Succeeded", "Failed"):
            continue
        going = " (being deleted)" if pod["metadata"].get("deletionTimestamp") else ""
        print(f"pod {name}{going}: {status.get('phase')}, not ready")
        for condition in status.get("conditions", []):
            if condition.get("status") != "True":
                print(f"  {condition['type']}: {condition.get('reason', '')} {condition.get('message', '')[:200]}")
        for container in status.get("containerStatuses", []):
            for state, detail in container.get("state", {}).items():
                print(f"  container {container['name']} {state} {detail.get('reason', '')} "
                      f"{detail.get('message', '')[:200]} restarts={container.get('restartCount')}")
        try:
            for line in kubectl("logs", "-n", namespace, name, "--all-containers", "--tail=3").splitlines():
                print(f"  log: {line[:300]}")
        except Exception as error:  # a pod not started has no log: that is the news
            print(f"  log: {error}")
    return pool


def pool_pod(namespace, name):
    """What the pool pod says of each Function it holds. Its `/pool` tells a caller from
    outside the pod only which Functions listen: through a port-forward the request comes
    from the pod's own loopback, and the answer has each one's load and error too."""
    forward = subprocess.Popen(["kubectl", "port-forward", "-n", namespace, f"pod/{name}", f":{ADMIN_PORT}"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        forwarding = re.search(r"127\.0\.0\.1:(\d+)", forward.stdout.readline())
        if not forwarding:
            print(f"pool pod {name}: no port-forward")
            return
        url = f"http://127.0.0.1:{forwarding.group(1)}/pool"
        with urllib.request.urlopen(url, timeout=5) as response:
            held = json.load(response)["functions"]
    except Exception as error:  # whatever it is, it is the news
        print(f"pool pod {name}: {error}")
        return
    finally:
        forward.terminate()
    for function, state in held.items():
        print(f"pool pod {name}: {function} port {state.get('port')} listening={state.get('listening')} "
              f"loaded={state.get('loaded')} {(state.get('error') or '')[:300]}")


def main():
    namespace = sys.argv[1]
    for part in (functions, pods):
        try:
            result = part(namespace)
        except Exception as error:
            print(f"{part.__name__}: {error}")
            result = None
        if part is pods:
            for name in result or []:
                pool_pod(namespace, name)


if __name__ == "__main__":
    main()
