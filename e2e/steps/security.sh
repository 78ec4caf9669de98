# The operator's least privilege: its RBAC, the admission policy that confines its writes,
# and the namespaced install.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

OPERATOR_ACCOUNT=system:serviceaccount:wasmless-system:wasmless-operator

least_privilege() {
  step "the operator's RBAC and admission policy: its own objects only, builder RBAC as written"
  echo "kubectl auth can-i --list --as=$OPERATOR_ACCOUNT -n $NS:"
  kubectl auth can-i --list --as="$OPERATOR_ACCOUNT" -n "$NS" | grep -vE '^selfsubject|^ +\[/' || true
  expect_eq "$(kubectl auth can-i delete services --as="$OPERATOR_ACCOUNT" -n "$NS")" yes "delete services (renames)"
  expect_eq "$(kubectl auth can-i update configmaps --as="$OPERATOR_ACCOUNT" -n "$NS" || true)" no "update configmaps"
  expect_eq "$(kubectl auth can-i get pods --as="$OPERATOR_ACCOUNT" -n "$NS" || true)" no "get pods"
  # The admission policy, asked with dry runs (admission runs, nothing is stored).
  local refused
  refused=$(kubectl create configmap wasmless-probe -n kube-system --from-literal=a=b --dry-run=server \
    --as="$OPERATOR_ACCOUNT" 2>&1 || true)
  expect_contains "$refused" "writes only its Functions' objects" "a ConfigMap in kube-system written as the operator"
  refused=$(kubectl create job wasmless-probe -n "$NS" --image=wasmless/builder:0.1.0 --dry-run=server \
    --as="$OPERATOR_ACCOUNT" 2>&1 || true)
  expect_contains "$refused" "denied" "a Job without the Function label, as the operator"
  refused=$(kubectl create rolebinding wasmless-builder -n "$NS" --role=wasmless-builder \
    --serviceaccount=kube-system:wasmless-builder --dry-run=server --as="$OPERATOR_ACCOUNT" 2>&1 || true)
  expect_contains "$refused" "of its namespace only" "the builder Role bound to another namespace's account, as the operator"
  # Pod specs labelled as a Function's, so that only the ServiceAccount rules can refuse
  # them; each with its accepted twin, so that a refusal is the rule's and no other's.
  refused=$(probe_job default | dry_run_as_operator)
  expect_contains "$refused" "build Jobs run as the wasmless-builder ServiceAccount only" "a build Job as the default account, as the operator"
  expect_contains "$(probe_job wasmless-builder | dry_run_as_operator)" "created (server dry run)" "a build Job as wasmless-builder, as the operator"
  refused=$(probe_deployment wasmless-builder false | dry_run_as_operator)
  expect_contains "$refused" "function pods run as the default ServiceAccount without its token" "function pods as another account, as the operator"
  refused=$(probe_deployment default true | dry_run_as_operator)
  expect_contains "$refused" "function pods run as the default ServiceAccount without its token" "function pods with a token, as the operator"
  expect_contains "$(probe_deployment default false | dry_run_as_operator)" "created (server dry run)" "function pods as the default account without a token, as the operator"
  refused=$(probe_deployment hello-chunk-reader true | dry_run_as_operator)
  expect_contains "$refused" "or as their Function's chunk reader" "function pods as another Function's chunk reader, as the operator"
  expect_contains "$(probe_deployment probe-chunk-reader true | dry_run_as_operator)" "created (server dry run)" "function pods as their Function's chunk reader, as the operator"
  refused=$(printf '%s\n' 'apiVersion: rbac.authorization.k8s.io/v1' 'kind: Role' \
    'metadata: {name: probe-chunk-reader, labels: {wasmless.io/function: probe}}' \
    'rules: [{apiGroups: [""], resources: [configmaps], verbs: [get], resourceNames: [hello-module-0123456789-0]}]' | dry_run_as_operator)
  expect_contains "$refused" "a chunk reader's Role only get its Function's chunk ConfigMaps" "a chunk reader Role naming another Function's chunks, as the operator"
  # hello's own chunk reader (its revisions are in ConfigMaps): its chunks, by name, and nothing else.
  local reader=system:serviceaccount:$NS:hello-chunk-reader chunk
  chunk=$(kubectl get role hello-chunk-reader -n "$NS" -o 'jsonpath={.rules[0].resourceNames[0]}')
  expect_contains "$chunk" "hello-" "the chunk reader Role names hello's chunks"
  expect_eq "$(kubectl auth can-i get "configmaps/$chunk" --as="$reader" -n "$NS")" yes "hello's chunk reader gets its chunk"
  expect_eq "$(kubectl auth can-i list configmaps --as="$reader" -n "$NS" || true)" no "hello's chunk reader lists no ConfigMaps"
  expect_eq "$(kubectl auth can-i get configmaps/hello-source --as="$reader" -n "$NS" || true)" no "hello's chunk reader gets no other ConfigMap"
  expect_eq "$(kubectl get deploy hello -n "$NS" -o 'jsonpath={.spec.template.spec.serviceAccountName}')" hello-chunk-reader \
    "hello's pods run as its chunk reader"
  # The operator's own writes pass it: the builder RBAC it wrote for hello is there.
  expect_eq "$(kubectl get role wasmless-builder -n "$NS" -o 'jsonpath={.rules[0].verbs}')" '["create","patch"]' \
    "the builder Role's verbs"
  # The namespace's pool (made by scale_to_zero): it reads ConfigMaps, and nothing else.
  local pool=system:serviceaccount:$NS:wasmless-pool
  expect_eq "$(kubectl auth can-i watch configmaps --as="$pool" -n "$NS")" yes "the pool watches ConfigMaps"
  expect_eq "$(kubectl auth can-i get secrets --as="$pool" -n "$NS" || true)" no "the pool reads no Secret"
  expect_eq "$(kubectl auth can-i patch configmaps --as="$pool" -n "$NS" || true)" no "the pool writes no ConfigMap"
  expect_eq "$(kubectl auth can-i list configmaps --as="$pool" -n kube-system || true)" no "the pool reads no other namespace"
  refused=$(printf '%s\n' 'apiVersion: rbac.authorization.k8s.io/v1' 'kind: Role' 'metadata: {name: wasmless-pool}' \
    'rules: [{apiGroups: [""], resources: [configmaps], verbs: [get, create]}]' | dry_run_as_operator)
  expect_contains "$refused" "the wasmless-pool Role only read them" "a pool Role that writes, as the operator"
  ok
}

# dry_run_as_operator: creates the manifest on stdin in $NS as the operator's ServiceAccount,
# admission run but nothing stored; prints what kubectl says, refusal included.
dry_run_as_operator() { kubectl create -n "$NS" -f - --dry-run=server --as="$OPERATOR_ACCOUNT" 2>&1 || true; }

probe_job() { # SERVICE_ACCOUNT: a build Job of Function probe running as it
  printf '%s\n' 'apiVersion: batch/v1' 'kind: Job' \
    'metadata: {name: wasmless-probe, labels: {wasmless.io/function: probe}}' \
    'spec:' '  template:' '    spec:' "      serviceAccountName: $1" '      restartPolicy: Never' \
    '      containers: [{name: builder, image: wasmless/builder:0.1.0}]'
}

probe_deployment() { # SERVICE_ACCOUNT AUTOMOUNT_TOKEN: function pods of Function probe
  printf '%s\n' 'apiVersion: apps/v1' 'kind: Deployment' \
    'metadata: {name: wasmless-probe, labels: {wasmless.io/function: probe}}' \
    'spec:' '  selector: {matchLabels: {wasmless.io/function: probe}}' '  template:' \
    '    metadata: {labels: {wasmless.io/function: probe}}' '    spec:' \
    "      serviceAccountName: $1" "      automountServiceAccountToken: $2" \
    '      containers: [{name: runtime, image: wasmless/runtime:0.1.0}]'
}

namespaced_install() {
  step "the namespaced install (deploy-namespaced/): the operator holds its verbs in one namespace only"
  kubectl create namespace functions --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  # `apply` does not remove what the cluster-wide install added.
  kubectl delete clusterrolebinding wasmless-operator --ignore-not-found >/dev/null
  kubectl apply -k deploy-namespaced >/dev/null
  kubectl rollout status deploy/wasmless-operator -n wasmless-system --timeout=180s >/dev/null
  local where
  for where in kube-system "$NS"; do
    expect_eq "$(kubectl auth can-i list configmaps --as="$OPERATOR_ACCOUNT" -n "$where" || true)" no "list configmaps in $where"
  done
  expect_eq "$(kubectl auth can-i create jobs --as="$OPERATOR_ACCOUNT" -n functions)" yes "create jobs in functions"
  wait_until 60 "a replica holding the Lease" leader
  local NS=functions
  new_function watched watched
  wait_until 60 "a build Job in functions" has_jobs watched
  ok
}
