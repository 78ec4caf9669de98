#!/usr/bin/env python3
"""Checks the operator's trace of one apply, as an OpenTelemetry Collector's file exporter
wrote it: the `apply` root span of Function FUNCTION, at least two reconciles under it, and
the build Job's span with the wait for its pod and the builder's phases, one after another.
Prints the trace as an indented tree with each span's start (from the apply's) and
seconds, then `trace <id>`; exits 1
saying what is missing (the e2e step retries until the trace is complete).

    python3 e2e/apply_trace.py spans.jsonl FUNCTION

No dependencies but Python's own (and e2e/trace_picture.py's reader).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trace_picture import ordered, read  # noqa: E402

PHASES = ["check", "compile", "snapshot", "precompile", "publish"]


def main():
    path, function = sys.argv[1], sys.argv[2]
    spans = read(path)
    roots = [s for s in spans if s["name"] == "apply" and s["attributes"].get("faas.name") == function]
    if not roots:
        sys.exit(f"no apply span of {function} yet ({len(spans)} spans in {path})")
    root = max(roots, key=lambda s: s["start"])
    trace = [s for s in spans if s["trace"] == root["trace"]]
    children = lambda parent: sorted((s for s in trace if s["parent"] == parent["id"]), key=lambda s: s["start"])
    reconciles = [s for s in children(root) if s["name"] == "reconcile"]
    builds = [s for s in children(root) if s["name"] == "build"]
    if len(reconciles) < 2 or len(builds) != 1:
        sys.exit(f"the apply has {len(reconciles)} reconcile and {len(builds)} build spans so far")
    if root["attributes"].get("wasmless.phase") != "Ready":
        sys.exit(f"the apply ended {root['attributes'].get('wasmless.phase')}, not Ready")
    parts = children(builds[0])
    names = [s["name"] for s in parts]
    expected = ["start build pod"] + [p for p in PHASES if p in names]
    if names != expected or not {"compile", "precompile", "publish"} <= set(names):
        sys.exit(f"the build's children are {names}, not the pod's start and the builder's phases in order")
    for before, after in zip(parts, parts[1:]):
        if after["start"] < before["end"]:
            sys.exit(f"{after['name']} starts before {before['name']} ends")
    for span in trace:
        if span["start"] < root["start"]:
            sys.exit(f"{span['name']} starts before the apply")
    for depth, span in ordered(trace):
        at = (span["start"] - root["start"]) / 1e9
        print(f"    {'  ' * depth}{span['name']}: at {at:.2f} s, {(span['end'] - span['start']) / 1e9:.2f} s")
    print(f"trace {root['trace']}")


if __name__ == "__main__":
    main()
