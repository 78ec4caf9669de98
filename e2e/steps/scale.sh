# Scaling a Function by hand and with an HPA on CPU (metrics-server): the operator keeps the
# count others write.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

ready_pods() { # FUNCTION: its runtime pods that are Ready
  kubectl get pods -n "$NS" -l "wasmless.io/function=$1,wasmless.io/component=runtime" \
    -o 'jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True || true
}

replicas_are() { # FUNCTION N: spec, ready pods and kubectl get fn's READY all say N
  [[ $(fn_field "$1" .spec.replicas) == "$2" && $(ready_pods "$1") == "$2" &&
    $(fn_field "$1" .status.readyReplicas) == "$2" ]]
}

scale_and_autoscale() {
  step "kubectl scale fn/hello --replicas=3, then an HPA on the Function: the operator keeps what they write"
  kubectl scale fn/hello -n "$NS" --replicas=3 >/dev/null
  wait_until 120 "3 ready pods of hello" replicas_are hello 3
  kubectl get fn hello -n "$NS"
  expect_eq "$(kubectl get fn hello -n "$NS" --no-headers | awk '{ print $4 }')" 3 "kubectl get fn's READY"
  # The example HPA, bounded to 2: above its maxReplicas, the HPA scales down before it reads
  # any metric (hello has no CPU request yet, so it has none to read; autoscale_on_cpu gives
  # it one).
  sed 's/maxReplicas: 10/maxReplicas: 2/' examples/hello-go/hpa.yaml | kubectl apply -n "$NS" -f - >/dev/null
  wait_until 120 "the HPA to scale hello to 2" replicas_are hello 2
  kubectl get hpa hello -n "$NS"
  expect_contains "$(kubectl describe hpa hello -n "$NS")" "above Spec.MaxReplicas" "the HPA's event"
  # The operator keeps the HPA's count: it writes only the Deployment, never spec.replicas.
  sleep 20
  replicas_are hello 2 || fail "hello did not stay at the HPA's 2: $(kubectl get fn,deploy hello -n "$NS" --no-headers)"
  kubectl delete hpa hello -n "$NS" >/dev/null
  kubectl scale fn/hello -n "$NS" --replicas=1 >/dev/null
  wait_until 120 "1 ready pod of hello" replicas_are hello 1
  ok
}

# hpa_watch FILE: `kubectl get hpa hello` (without AGE) each time it changes, seconds since
# the start in front.
hpa_watch() {
  local started=$SECONDS line last=""
  while :; do
    line=$(kubectl get hpa hello -n "$NS" --no-headers 2>&1 | awk '{ $NF = ""; print }')
    [[ $line != "$last" ]] && echo "    $((SECONDS - started))s  $line"
    last=$line
    sleep 2
  done >"$1"
}

autoscale_on_cpu() {
  step "the example HPA on hello's CPU (metrics-server): 1 -> 2+ replicas under a wrk load, back to 1 after it"
  # Utilization is measured against the CPU request, which Function.spec.resources sets on the
  # runtime container.
  kubectl patch fn hello -n "$NS" --type merge -p '{"spec":{"resources":{"requests":{"cpu":"100m"}}}}' >/dev/null
  cpu_requested() {
    [[ $(kubectl get deploy hello -n "$NS" -o 'jsonpath={.spec.template.spec.containers[0].resources.requests.cpu}') == 100m ]]
  }
  wait_until 60 "the CPU request on hello's Deployment" cpu_requested
  kubectl rollout status deploy/hello -n "$NS" --timeout=120s >/dev/null
  wait_until 120 "1 ready pod of hello" replicas_are hello 1
  # The example, with room to show a scale-out on this one node, and a scale-down window of
  # 15 s instead of 300 s, so that the step waits less for the load's end to count.
  {
    sed 's/maxReplicas: 10/maxReplicas: 3/' examples/hello-go/hpa.yaml
    printf '  behavior:
    scaleDown:
      stabilizationWindowSeconds: 15
'
  } | kubectl apply -n "$NS" -f - >/dev/null
  hpa_watch "$WORK/hpa.log" &
  PIDS+=($!)
  local watch=$!
  # metrics-server has two samples of the new pod's CPU: the HPA has a utilization.
  measured() {
    [[ -n $(kubectl get hpa hello -n "$NS" -o 'jsonpath={.status.currentMetrics[0].resource.current.averageUtilization}') ]]
  }
  wait_until 120 "the HPA to measure hello's CPU" measured
  kubectl top pods -n "$NS" -l wasmless.io/function=hello,wasmless.io/component=runtime
  replicas_are hello 1 || fail "the HPA scaled idle hello to $(fn_field hello .spec.replicas)"

  local url started load
  url=$(service_url hello)
  started=$SECONDS
  wrk -t1 -c4 -d600s "$url" >"$WORK/wrk.log" 2>&1 &
  PIDS+=($!)
  load=$!
  scaled_out() { (($(fn_field hello .spec.replicas) >= 2 && $(ready_pods hello) >= 2)); }
  wait_until 240 "the HPA to scale hello out under load" scaled_out
  echo "    $(ready_pods hello) ready pods of hello after $((SECONDS - started))s of load"
  # What the HPA wrote is what runs: the operator rolls out spec.replicas and never writes it.
  local written
  written=$(fn_field hello .spec.replicas)
  expect_eq "$(kubectl get hpa hello -n "$NS" -o 'jsonpath={.status.desiredReplicas}')" "$written" "the HPA's desiredReplicas"
  expect_eq "$(kubectl get deploy hello -n "$NS" -o 'jsonpath={.spec.replicas}')" "$written" "the Deployment's replicas"
  # wrk prints its summary when interrupted.
  kill -INT "$load"
  wait "$load" 2>/dev/null || true
  grep -E 'Requests/sec|requests in' "$WORK/wrk.log" | sed 's/^ */    wrk: /' || true

  started=$SECONDS
  # The HPA's own count too: `kubectl get hpa` says 1 as well, one sync after the Function.
  scaled_in() {
    replicas_are hello 1 && [[ $(kubectl get hpa hello -n "$NS" -o 'jsonpath={.status.currentReplicas}') == 1 ]]
  }
  wait_until 240 "the HPA to scale hello back to 1 after the load" scaled_in
  echo "    1 ready pod of hello, and the HPA counting it, $((SECONDS - started))s after the load stopped"
  kill "$watch" 2>/dev/null || true
  echo "    kubectl get hpa hello, at each change:"
  cat "$WORK/hpa.log"
  kubectl get hpa hello -n "$NS"
  expect_contains "$(kubectl describe hpa hello -n "$NS")" "cpu resource utilization (percentage of request) above target" \
    "the HPA's reason for the scale-out"
  kubectl delete hpa hello -n "$NS" >/dev/null
  ok
}
