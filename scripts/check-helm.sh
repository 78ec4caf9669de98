#!/usr/bin/env bash
# The Helm chart (deploy/helm/wasmless) and kustomize (deploy/, the no-tools path) install
# the same objects: renders both and compares them object by object
# (scripts/compare-manifests.py), for the cluster-wide install, the namespaced one
# (deploy-namespaced/), the Prometheus objects (deploy/prometheus/), the node agent
# (deploy/node-agent/) and events (deploy/events/); and `helm lint --strict` with each of
# those values. A change to one side without the other fails here.
# Needs kubectl and python3 with PyYAML; builds helm when missing (scripts/lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

SAY_AS=check-helm
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
PATH="$(dirname "$(helm_tool)"):$PATH"
python3 -c 'import yaml' 2>/dev/null || { echo "python3 lacks PyYAML: pip install pyyaml" >&2; exit 1; }

CHART=deploy/helm/wasmless
RELEASE_NS=wasmless-system # deploy/'s namespace; the chart installs into the release's
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

namespaced=(--set watchNamespace=functions) # deploy-namespaced/'s namespace
prometheus=(--set prometheus.scrapeConfig.create=true --set prometheus.rbac.create=true)
node_agent=(--set nodeAgent.install=true --set pool.nodeCodeStore=true)
events=(--set events.enabled=true)

for values in "" "${namespaced[*]}" "${prometheus[*]}" "${node_agent[*]}" "${events[*]}" "${events[*]} ${namespaced[*]}"; do
  # shellcheck disable=SC2086 # the --set pairs split on spaces
  helm lint --strict --quiet "$CHART" --namespace "$RELEASE_NS" $values >"$work/lint" 2>&1 ||
    { cat "$work/lint" >&2; echo "helm lint ${values:-(default values)}: failed" >&2; exit 1; }
done
echo "helm lint: clean with the default, namespaced, Prometheus, node agent and events values"

# Every setting of the operator (its WASMLESS_* variables) is one the chart can set, but
# those the chart fixes on purpose: the admin address its probes and Service name, the
# Lease its Role names, and the builder version, which is the builder image the chart sets.
chart_fixes="WASMLESS_METRICS_ADDR WASMLESS_LEASE_NAME WASMLESS_BUILDER_VERSION"
missing=""
settings=$(grep -o 'env = "WASMLESS_[A-Z_]*"' operator/src/flags.rs | cut -d'"' -f2 | sort -u)
# Fewer than there are would mean the flags moved again and this check read nothing.
(($(wc -w <<<"$settings") >= 15)) || { echo "found only $(wc -w <<<"$settings") operator settings in operator/src/flags.rs: where did the flags go?" >&2; exit 1; }
for setting in $settings; do
  [[ " $chart_fixes " == *" $setting "* ]] && continue
  grep -q "name: $setting\$" "$CHART/templates/operator.yaml" || missing+=" $setting"
done
[[ -z $missing ]] || { echo "the chart cannot set these operator settings:$missing (add a value in $CHART/values.yaml and docs/operator.md)" >&2; exit 1; }
echo "every operator setting has a value in the chart"

# The chart's files/ link to crds/function.yaml and deploy/prometheus/prometheus.yml, so
# there is one copy of each; Helm follows the links and says so on every render.
template() {
  helm template wasmless "$CHART" --namespace "$RELEASE_NS" "$@" 2> >(grep -v 'found symbolic link in path' >&2)
}

# The Namespace: Helm users pass `--create-namespace` (or install into one they made), and
# a chart cannot hold the namespace its release is stored in.
echo "deploy/ and the chart's default values:"
kubectl kustomize deploy/ >"$work/kustomize.yaml"
template >"$work/helm.yaml"
python3 scripts/compare-manifests.py "$work/kustomize.yaml" "$work/helm.yaml" --only-expected "Namespace//$RELEASE_NS"

echo "deploy-namespaced/ and watchNamespace=functions:"
kubectl kustomize deploy-namespaced/ >"$work/kustomize.yaml"
template "${namespaced[@]}" >"$work/helm.yaml"
python3 scripts/compare-manifests.py "$work/kustomize.yaml" "$work/helm.yaml" --only-expected "Namespace//$RELEASE_NS"

echo "deploy/prometheus/ and prometheus.scrapeConfig.create, prometheus.rbac.create:"
{
  cat deploy/prometheus/rbac.yaml
  echo "---"
  kubectl create configmap wasmless-prometheus -n "$RELEASE_NS" --from-file=deploy/prometheus/prometheus.yml --dry-run=client -o yaml |
    kubectl label --local -f - app.kubernetes.io/part-of=wasmless -o yaml
} >"$work/kustomize.yaml"
template "${prometheus[@]}" --show-only templates/prometheus.yaml >"$work/helm.yaml"
python3 scripts/compare-manifests.py "$work/kustomize.yaml" "$work/helm.yaml"

echo "deploy/node-agent/ and nodeAgent.install:"
kubectl kustomize deploy/node-agent/ >"$work/kustomize.yaml"
template "${node_agent[@]}" --show-only templates/node-agent.yaml >"$work/helm.yaml"
python3 scripts/compare-manifests.py "$work/kustomize.yaml" "$work/helm.yaml"

echo "deploy/events/ and events.enabled:"
kubectl kustomize deploy/events/ >"$work/kustomize.yaml"
template "${events[@]}" --show-only templates/events.yaml >"$work/helm.yaml"
python3 scripts/compare-manifests.py "$work/kustomize.yaml" "$work/helm.yaml"
