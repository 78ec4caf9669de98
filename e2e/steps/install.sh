# The operator installed as deploy/ has it, and the Goless sample built once and served:
# what a new user does first.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

install_operator() {
  step "kubectl apply -k deploy/node-agent/ and deploy/: the node agent is registered, the operator is available and one replica holds the Lease"
  install_node_agent # steps/node_store.sh
  # deploy/ as shipped, plus the registry of this test (e2e/operator/kustomization.yaml).
  sed "s/@REGISTRY@/$REGISTRY/g" e2e/operator/kustomization.yaml.in >e2e/operator/kustomization.yaml
  kubectl apply -k e2e/operator >/dev/null
  kubectl rollout status deploy/wasmless-operator -n wasmless-system --timeout=180s >/dev/null
  wait_until 60 "a replica holding the Lease" leader
  local holder
  holder=$(leader)
  kubectl get pod "$holder" -n wasmless-system >/dev/null || fail "the Lease holder $holder is not an operator pod"
  # A run on a cluster that already ran this starts from an empty namespace.
  kubectl delete namespace "$NS" --ignore-not-found --wait=true --timeout=120s >/dev/null
  kubectl create namespace "$NS" >/dev/null
  ok
}

leader() {
  local holder
  holder=$(kubectl get lease wasmless-operator -n wasmless-system -o 'jsonpath={.spec.holderIdentity}')
  [[ -n $holder ]] && kubectl get pod "$holder" -n wasmless-system >/dev/null 2>&1 && echo "$holder"
}

goless_sample() {
  step "the Goless sample: one build Job, module ConfigMaps, a rollout, Ready, This works! through the Service"
  kubectl apply -n "$NS" -f examples/hello-go/function.yaml >/dev/null
  wait_until 30 "a build Job" has_jobs hello
  kubectl wait job -n "$NS" -l wasmless.io/function=hello --for=condition=Complete --timeout=600s >/dev/null
  expect_eq "$(jobs_of hello)" 1 "build Jobs of hello"
  # The namespace's first Go build: its empty GOCACHE is filled from the builder image's
  # seed, so go build compiles the handler and the SDK, not the standard library.
  local build_log
  build_log=$(kubectl logs -n "$NS" "$(kubectl get jobs -n "$NS" -l wasmless.io/function=hello -o name)" -c builder 2>&1)
  expect_contains "$build_log" "seeded with the image's standard library" "the first build's log"
  echo "    first Go build in $NS: compile $(grep -o '"compile":[0-9.]*' <<<"$build_log" | head -1 | cut -d: -f2) s (go build, from the seed)"
  # The pods start while the build runs (they wait for it, not ready).
  local created completed
  created=$(kubectl get deploy hello -n "$NS" -o 'jsonpath={.metadata.creationTimestamp}')
  completed=$(kubectl get jobs -n "$NS" -l wasmless.io/function=hello -o 'jsonpath={.items[0].status.completionTime}')
  [[ -n $created && ! $created > $completed ]] ||
    fail "hello's Deployment was created at ${created:-no time}, after its build ended at $completed: its pods did not start during the build"
  local chunks
  chunks=$(kubectl get cm -n "$NS" -l "wasmless.io/function=hello,wasmless.io/module-digest" -o name | wc -l)
  [[ $chunks -ge 1 ]] || fail "no module ConfigMaps"
  kubectl wait fn/hello -n "$NS" --for=condition=Ready --timeout=180s >/dev/null
  kubectl rollout status deploy/hello -n "$NS" --timeout=60s >/dev/null
  local table
  table=$(kubectl get fn -n "$NS")
  echo "$table"
  expect_eq "$(awk 'NR == 1 { print $1, $2, $3, $4, $5, $6, $7, $8, $9 }' <<<"$table")" "NAME LANGUAGE PHASE READY SERVED DIGEST URL TRIGGERS AGE" "kubectl get fn's columns"
  local digest
  digest=$(fn_field hello .status.moduleDigest)
  expect_eq "$(awk '$1 == "hello" { print $2, $3, $4, $5, $6, $7 }' <<<"$table")" \
    "go Ready 1 pods ${digest:7:10} http://hello.$NS.svc.cluster.local:9000" "kubectl get fn's row"
  expect_service_answer hello "This works!"
  ok
}

new_pod_precompiled() {
  step "a scaled-out pod loads the builder's compiled code and compiles nothing"
  local code replicas
  code=$(fn_field hello .status.codeDigest)
  [[ $code == sha256:* ]] || fail "hello has no status.codeDigest"
  local code_maps
  code_maps=$(kubectl get cm -n "$NS" -l wasmless.io/function=hello -o name | grep -c -- '-code-' || true)
  [[ $code_maps -ge 1 ]] || fail "no compiled-code ConfigMaps for hello"
  echo "    code $code in $code_maps ConfigMaps"
  replicas=$(fn_field hello .spec.replicas)
  kubectl patch fn hello -n "$NS" --type merge -p '{"spec":{"replicas":2}}' >/dev/null
  # The operator scales the Deployment after the patch: a rollout status read before that
  # sees 1 of 1 and returns while the new pod is still being created.
  wait_until 30 "the Deployment asking for 2 pods" deployment_replicas_are hello 2
  wait_until 60 "2 ready pods of hello" deployment_ready_replicas_are hello 2
  local newest log
  newest=$(kubectl get pods -n "$NS" -l wasmless.io/function=hello --sort-by=.metadata.creationTimestamp -o name | tail -1)
  log=$(kubectl logs -n "$NS" "$newest")
  expect_contains "$log" '"compiled_code":"precompiled"' "the new pod's module load"
  [[ $log != *"not using the precompiled code"* ]] || fail "the new pod fell back to compiling: $log"
  echo "    $(grep -o '"load_ms":[0-9.]*' <<<"$log" | head -1) in $newest"
  kubectl patch fn hello -n "$NS" --type merge -p "{\"spec\":{\"replicas\":${replicas:-1}}}" >/dev/null
  ok
}

deployment_replicas_are() { [[ $(kubectl get deploy "$1" -n "$NS" -o 'jsonpath={.spec.replicas}') == "$2" ]]; }
deployment_ready_replicas_are() {
  [[ $(kubectl get deploy "$1" -n "$NS" -o 'jsonpath={.status.readyReplicas}/{.status.updatedReplicas}') == "$2/$2" ]]
}
