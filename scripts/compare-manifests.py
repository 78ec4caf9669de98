#!/usr/bin/env python3
"""Compares two multi-document YAML streams object by object (scripts/check-helm.sh).

    compare-manifests.py EXPECTED ACTUAL [--only-expected KIND/NAMESPACE/NAME]...

EXPECTED is what kustomize renders, ACTUAL what `helm template` renders. Objects are matched
by apiVersion, kind, namespace and name and must be equal, except for what Helm adds by
design: its own labels (managed-by, instance, version, helm.sh/chart) and the CRD's
`helm.sh/resource-policy` annotation. Exits 1, printing a diff per object, when they differ.
"""
import argparse
import difflib
import sys

import yaml

# What the chart adds to every object and kustomize does not: Helm's bookkeeping, not spec.
HELM_LABELS = {
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "helm.sh/chart",
}
HELM_ANNOTATIONS = {"helm.sh/resource-policy"}
# Kinds without a namespace. kustomize's `namespace:` puts one on those it does not know as
# cluster-scoped (ValidatingAdmissionPolicy and its binding); the API server ignores it.
CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def cel_spacing(value):
    """CEL `expression`s with their whitespace collapsed, wherever they are.

    kustomize's YAML library reads a folded (`>-`) line break before a more-indented line as
    two newlines where the YAML spec (and Helm, which passes the text through) has one, so
    deploy/admission.yaml's expressions come out with an extra blank line. CEL ignores
    whitespace between tokens, and these expressions have none inside their string literals.
    """
    if isinstance(value, dict):
        return {
            k: " ".join(v.split()) if k == "expression" and isinstance(v, str) else cel_spacing(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [cel_spacing(v) for v in value]
    return value


def load(path):
    with open(path) as f:
        return [cel_spacing(doc) for doc in yaml.safe_load_all(f) if doc]


def key(obj):
    meta = obj.get("metadata", {})
    return f"{obj.get('apiVersion')} {obj.get('kind')}/{meta.get('namespace', '')}/{meta.get('name')}"


def normalise(obj, from_helm):
    meta = obj.setdefault("metadata", {})
    if obj.get("kind") in CLUSTER_SCOPED:
        meta.pop("namespace", None)
    if meta.get("creationTimestamp") is None:
        meta.pop("creationTimestamp", None)
    for field, helm_keys in (("labels", HELM_LABELS), ("annotations", HELM_ANNOTATIONS)):
        values = meta.get(field) or {}
        if from_helm:
            values = {k: v for k, v in values.items() if k not in helm_keys}
        if values:
            meta[field] = values
        else:
            meta.pop(field, None)
    return obj


def short(k):
    """`apps/v1 Deployment/ns/name` -> `Deployment/ns/name`, the form --only-expected takes."""
    return k.split(" ", 1)[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("expected")
    parser.add_argument("actual")
    parser.add_argument("--only-expected", action="append", default=[],
                        help="KIND/NAMESPACE/NAME that only EXPECTED has, on purpose")
    args = parser.parse_args()

    expected = {key(normalise(o, False)): o for o in load(args.expected)}
    actual = {key(normalise(o, True)): o for o in load(args.actual)}
    problems = []
    for k in sorted(expected.keys() - actual.keys()):
        if short(k) not in args.only_expected:
            problems.append(f"only in {args.expected}: {k}")
    for k in sorted(actual.keys() - expected.keys()):
        problems.append(f"only in {args.actual}: {k}")
    for only in args.only_expected:
        if not any(short(k) == only for k in expected):
            problems.append(f"--only-expected {only}: {args.expected} has no such object any more")
    for k in sorted(expected.keys() & actual.keys()):
        if expected[k] != actual[k]:
            a = yaml.safe_dump(expected[k], sort_keys=True).splitlines()
            b = yaml.safe_dump(actual[k], sort_keys=True).splitlines()
            diff = "\n".join(difflib.unified_diff(a, b, args.expected, args.actual, lineterm=""))
            problems.append(f"{k} differs:\n{diff}")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    print(f"{len(actual)} objects equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
