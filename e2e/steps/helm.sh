# The Helm chart taking over the running deploy/ install, then upgraded.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

operator_pods_ready() { # N: the operator Deployment has N replicas, all ready and updated
  local deploy
  deploy=$(kubectl get deploy wasmless-operator -n wasmless-system \
    -o 'jsonpath={.spec.replicas} {.status.readyReplicas} {.status.updatedReplicas} {.status.replicas}')
  [[ $deploy == "$1 $1 $1 $1" ]]
}

helm_install() {
  step "helm install of deploy/helm/wasmless over deploy/: a new Function built and served; helm upgrade to 1 operator replica, still serving"
  local helm
  helm=$(helm_tool)
  PATH="$(dirname "$helm"):$PATH"
  local chart=deploy/helm/wasmless
  # The e2e overlay's settings (e2e/operator/) as chart values.
  local values=(--namespace wasmless-system --set "storage.oci.registry=$REGISTRY" --set "storage.oci.plainHTTP={$REGISTRY}")
  # A cluster that ran this step already: the release goes (its CRD is kept, and with it
  # the Functions), and is installed anew.
  helm uninstall wasmless --namespace wasmless-system --ignore-not-found --wait >/dev/null
  # The cluster runs deploy/ (install_operator), as a user moving to Helm has it: Helm takes
  # those objects over (--take-ownership) instead of refusing them, and nothing is deleted.
  # Adoption merges and so keeps what the chart does not set: after namespaced_install, the
  # operator's WASMLESS_WATCH_NAMESPACE would stay. That Deployment goes first; Helm makes it.
  if kubectl get deploy wasmless-operator -n wasmless-system -o 'jsonpath={.spec.template.spec.containers[0].env[*].name}' |
    grep -qw WASMLESS_WATCH_NAMESPACE; then
    kubectl delete deploy wasmless-operator -n wasmless-system --wait=true >/dev/null
  fi
  helm install wasmless "$chart" "${values[@]}" --take-ownership --wait --timeout 180s >/dev/null
  expect_eq "$(helm status wasmless -n wasmless-system -o json | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["info"]["status"], r["version"])')" \
    "deployed 1" "the release"
  expect_eq "$(kubectl get deploy wasmless-operator -n wasmless-system -o 'jsonpath={.metadata.labels.app\.kubernetes\.io/managed-by}')" \
    Helm "the operator Deployment's manager"
  # The namespaced install (namespaced_install) had removed it; the chart's default is cluster-wide.
  kubectl get clusterrolebinding wasmless-operator >/dev/null || fail "no ClusterRoleBinding wasmless-operator"
  wait_until 120 "2 ready operator replicas" operator_pods_ready 2
  wait_until 60 "a replica holding the Lease" leader
  new_function helmed "served through the Helm release"
  wait_until 60 "a build Job of helmed" has_jobs helmed
  kubectl wait fn/helmed -n "$NS" --for=condition=Ready --timeout=600s >/dev/null
  # Ready is the pods' readiness; kube-proxy programs the new Service a moment later.
  local url
  url=$(service_url helmed)
  answers() { [[ $(get "$url") == "$1" ]]; }
  wait_until 30 "helmed to answer through its Service" answers "served through the Helm release"

  # A changed value with a visible effect: one operator replica instead of two.
  helm upgrade wasmless "$chart" "${values[@]}" --set operator.replicas=1 --wait --timeout 180s >/dev/null
  expect_eq "$(helm history wasmless -n wasmless-system --max 1 -o json | python3 -c 'import json,sys; r=json.load(sys.stdin)[-1]; print(r["revision"], r["status"])')" \
    "2 deployed" "the release after helm upgrade"
  wait_until 120 "1 ready operator replica" operator_pods_ready 1
  one_operator_pod() { [[ $(kubectl get pods -n wasmless-system -l app.kubernetes.io/name=wasmless-operator --no-headers | wc -l) == 1 ]]; }
  wait_until 120 "the other operator pod to go" one_operator_pod
  wait_until 60 "the remaining replica holding the Lease" leader
  expect_eq "$(get_service helmed)" "served through the Helm release" "GET through helmed's Service after the upgrade"
  # The upgraded operator still reconciles: a source change is built and served.
  new_function helmed upgraded # its `source` (set_source writes the Goless `function` field)
  wait_until 600 "helmed to answer the new source" answers upgraded

  # Back to deploy/'s two replicas, for any step after this one.
  helm upgrade wasmless "$chart" "${values[@]}" --wait --timeout 180s >/dev/null
  wait_until 120 "2 ready operator replicas" operator_pods_ready 2
  ok
}
