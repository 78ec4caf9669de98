# A Function refused, a build past its deadline, a Function deleted mid-build: with the
# installed operator, the Job controller and the real builder.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

port_clash() {
  step "serverPort 9090 (the metrics port): refused on status, the other Functions still reconciled"
  new_function clash clash $'  serverPort: 9090\n'
  wait_until 60 "phase Failed" phase_is clash Failed
  local message
  message=$(fn_field clash .status.buildMessage)
  echo "buildMessage: $message"
  expect_contains "$message" "serverPort 9090 is the Service's metrics port" "status.buildMessage"
  expect_eq "$(jobs_of clash)" 0 "build Jobs of clash"
  phase_is hello Ready || fail "hello: phase $(fn_field hello .status.phase)"
  # While clash stands refused, a change to hello (a new generation) is still reconciled.
  kubectl patch fn hello -n "$NS" --type merge -p '{"spec": {"env": [{"name": "SEEN_AFTER_CLASH", "value": "1"}]}}' >/dev/null
  local generation
  generation=$(kubectl get fn hello -n "$NS" -o 'jsonpath={.metadata.generation}')
  hello_observed() { [[ $(fn_field hello .status.observedGeneration) == "$generation" ]]; }
  wait_until 60 "hello's status.observedGeneration to reach $generation" hello_observed
  # The handler's env is the runtime container's WASMLESS_HANDLER_ENV_* variables.
  expect_eq "$(kubectl get deploy hello -n "$NS" -o 'jsonpath={.spec.template.spec.containers[0].env[?(@.name=="WASMLESS_HANDLER_ENV_SEEN_AFTER_CLASH")].value}')" \
    1 "hello's handler env in its pod template after the change"
  phase_is clash Failed || fail "clash: phase $(fn_field clash .status.phase)"
  kubectl delete fn clash -n "$NS" >/dev/null
  # The next steps start from hello served and rolled out.
  kubectl wait fn/hello -n "$NS" --for=condition=Ready --timeout=180s >/dev/null
  kubectl rollout status deploy/hello -n "$NS" --timeout=120s >/dev/null
  ok
}

build_deadline() {
  step "a builder stopped by the Job's deadline: DeadlineExceeded on status, not the log tail"
  new_function slow slow
  wait_until 30 "a build Job" has_jobs slow
  # The deadline is the operator's (900 s); shortened here on the live Job, as a hung
  # compiler would exhaust it.
  kubectl patch "$(kubectl get jobs -n "$NS" -l wasmless.io/function=slow -o name)" -n "$NS" --type merge \
    -p '{"spec": {"activeDeadlineSeconds": 2}}' >/dev/null
  wait_until 120 "phase Failed" phase_is slow Failed
  local reason message
  reason=$(fn_field slow '.status.conditions[?(@.type=="Built")].reason')
  message=$(fn_field slow .status.buildMessage)
  echo "Built: $reason: $message"
  expect_eq "$reason" DeadlineExceeded "Built's reason"
  expect_contains "$message" "ran longer than its deadline of 2 s" "status.buildMessage"
  kubectl delete fn slow -n "$NS" >/dev/null
  ok
}

delete_during_build() {
  step "a Function deleted while its builder runs: no ConfigMap, Job or pod of it is left"
  new_function doomed doomed
  builder_running() { [[ -n $(kubectl get pods -n "$NS" -l wasmless.io/function=doomed --field-selector=status.phase=Running -o name) ]]; }
  wait_until 120 "the builder of doomed to run" builder_running
  local uid env
  uid=$(kubectl get fn doomed -n "$NS" -o 'jsonpath={.metadata.uid}')
  env=$(kubectl get jobs -n "$NS" -l wasmless.io/function=doomed -o 'jsonpath={.items[0].spec.template.spec.containers[0].env[?(@.name=="WASMLESS_FUNCTION_UID")].value}')
  expect_eq "$env" "$uid" "the build Job's WASMLESS_FUNCTION_UID"
  kubectl delete fn doomed -n "$NS" --wait=false >/dev/null
  nothing_left() {
    [[ -z $(kubectl get cm,jobs,pods -n "$NS" -l wasmless.io/function=doomed --no-headers 2>/dev/null) ]] &&
      [[ $'\n'$(kubectl get cm -n "$NS" -o name) != *$'\n'configmap/doomed-* ]]
  }
  wait_until 120 "everything of doomed collected" nothing_left
  # A builder that published after the deletion would show now: its chunks are collected too.
  sleep 10
  nothing_left || fail "left behind: $(kubectl get cm,jobs,pods -n "$NS" -o name | grep doomed)"
  ok
}
