# The e2e run's reporting (a step, its checks, the summary line) and the helpers its steps
# share: a Function's fields, its Service's address, a GET through it. Sourced by e2e/run.sh.

# ---- reporting -------------------------------------------------------------------------

step() {
  current=$1
  step_start=$SECONDS
  printf '\n--- %s\n' "$1"
}

ok() {
  passed=$((passed + 1))
  echo "ok - $current ($((SECONDS - step_start)) s)"
}

fail() {
  echo "FAILED: $*" >&2
  exit 1
}
die() { fail "$@"; } # scripts/lib.sh's wait_until fails the step

expect_eq() { # ACTUAL EXPECTED WHAT
  [[ $1 == "$2" ]] || fail "$3: expected '$2', got '$1'"
}

expect_contains() { # TEXT PART WHAT
  [[ $1 == *"$2"* ]] || fail "$3: '$2' not in: $1"
}

diagnostics() {
  echo "=== in brief (e2e/in_brief.py), and the last warnings"
  timeout 60 python3 e2e/in_brief.py "$NS" || true
  kubectl get events -n "$NS" --field-selector type=Warning --sort-by=.lastTimestamp 2>&1 | tail -6 || true
  echo "=== what the cluster holds"
  kubectl get fn,deploy,rs,pods,jobs,svc,cm -n "$NS" -o wide 2>&1 | head -60 || true
  kubectl get pods -n wasmless-system -o wide 2>&1 || true
  kubectl get fn -n "$NS" -o yaml 2>&1 | grep -A30 '^  status:' | head -80 || true
  kubectl get events -n "$NS" --sort-by=.lastTimestamp 2>&1 | tail -30 || true
  local pod
  for pod in $(kubectl get pods -n wasmless-system -o name 2>/dev/null); do
    echo "=== logs of $pod"
    kubectl logs -n wasmless-system "$pod" --tail=30 2>&1 || true
  done
  echo "=== the node agent (deploy/node-agent/)"
  kubectl logs -n wasmless-node ds/wasmless-node-agent --tail=20 2>&1 || true
  for pod in $(kubectl get pods -n "$NS" -o name 2>/dev/null | head -8); do
    echo "=== logs of $pod"
    kubectl logs -n "$NS" "$pod" --all-containers --tail=15 2>&1 || true
  done
}

finish() {
  local status=$?
  # Only the test itself reports and cleans up, not a subshell it started in the background.
  [[ $BASHPID == "$MAIN_PID" ]] || return 0
  if [[ $status != 0 ]]; then
    echo "not ok - $current"
    diagnostics
  fi
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # A load loop stopped by the failure above reports what it saw up to it.
  if [[ $status != 0 && -s $WORK/load.txt ]]; then sed 's/^/    wasmless-load: /' "$WORK/load.txt"; fi
  rm -rf "$WORK"
  if [[ $status == 0 ]]; then echo "$passed passed, 0 failed"; else echo "$passed passed, 1 failed"; fi
  exit "$status"
}
MAIN_PID=$BASHPID
trap finish EXIT

# ---- helpers ---------------------------------------------------------------------------

fn_field() { kubectl get fn "$1" -n "$NS" -o "jsonpath={$2}"; }

# service_url FUNCTION: the function's Service as the node reaches it (ClusterIP, kube-proxy).
service_url() {
  local service
  service=$(kubectl get fn "$1" -n "$NS" -o 'jsonpath={.spec.service}')
  kubectl get svc "${service:-$1}" -n "$NS" \
    -o 'jsonpath=http://{.spec.clusterIP}:{.spec.ports[?(@.name=="http")].port}/'
}

get() { curl -fsS --max-time 5 "$1"; }

# get_service FUNCTION: one GET through the function's Service.
get_service() { get "$(service_url "$1")"; }

# expect_answer_at URL EXPECTED WHAT: URL's answer, for a new Service or a pod just Ready.
# Ready is the pods' readiness; kube-proxy programs the Service a moment later, and until
# then its ClusterIP refuses connections. Up to 30 s for that, then the answer is checked.
expect_answer_at() {
  local deadline=$((SECONDS + 30))
  until [[ $(get "$1" 2>/dev/null) == "$2" ]] || ((SECONDS >= deadline)); do sleep 1; done
  expect_eq "$(get "$1")" "$2" "$3"
}

# wait_for_connections URL WHAT: until URL's host and port take a TCP connection (no
# request is sent), up to 30 s. kube-proxy programs a new Service's ClusterIP a moment
# after it is made; until then a connection to it is not DNATed and fails after ~3 s.
# For a step whose first request must be the Function's first, or must not be retried.
wait_for_connections() {
  local address=${1#http://}
  address=${address%%/*}
  accepts() { timeout 1 bash -c "exec 3<>/dev/tcp/${address%:*}/${address##*:}" 2>/dev/null; }
  wait_until 30 "$2 to take connections" accepts
}

# expect_service_answer FUNCTION EXPECTED: a new Service's answer at /.
expect_service_answer() {
  expect_answer_at "$(service_url "$1")" "$2" "GET through $1's Service"
}

# start_request_loop URL LOG: GETs URL every 50 ms in the background, one line per request
# in LOG ("<epoch seconds> ok <body>" or "... FAIL <error>"), until stop_request_loop LOG.
start_request_loop() {
  local url=$1 log=$2
  rm -f "$log.stop"
  (
    while [[ ! -f $log.stop ]]; do
      if body=$(get "$url" 2>&1); then echo "$(date +%s.%N) ok $body"; else echo "$(date +%s.%N) FAIL $body"; fi
      sleep 0.05
    done
  ) >"$log" &
  PIDS+=($!)
  REQUEST_LOOP=$!
}

# stop_request_loop LOG: ends start_request_loop's loop once its request in flight is done.
stop_request_loop() {
  touch "$1.stop"
  wait "$REQUEST_LOOP" || true
}

# request_loop_figures LOG STARTED ANSWER: a stopped loop's requests, its failures (the first
# few on stderr) and the seconds from STARTED (epoch seconds) to its first ANSWER.
request_loop_figures() {
  local log=$1 started=$2 answer=$3
  local total failed first
  total=$(wc -l <"$log")
  failed=$(grep -c ' FAIL' "$log" || true)
  first=$(awk -v t="$started" -v a="$answer" '$1 > t && $2 == "ok" && $3 == a { print $1 - t; exit }' "$log")
  grep ' FAIL' "$log" | head -5 >&2 || true
  echo "$total $failed $first"
}

# pods_whose_routes_name PODS TEXT: how many of PODS (those still there) have TEXT in their
# wasmless.io/routes annotation, that is, were switched in place to what TEXT names.
pods_whose_routes_name() {
  local pod routes count=0
  for pod in $1; do
    routes=$(kubectl get pod "$pod" -n "$NS" -o 'jsonpath={.metadata.annotations.wasmless\.io/routes}' 2>/dev/null) || continue
    [[ $routes == *"$2"* ]] && count=$((count + 1))
  done
  echo "$count"
}

jobs_of() { kubectl get jobs -n "$NS" -l "wasmless.io/function=$1" -o name | wc -l; }
has_jobs() { [[ $(jobs_of "$1") -ge 1 ]]; }

phase_is() { [[ $(fn_field "$1" .status.phase) == "$2" ]]; }

go_handler() { # MESSAGE: a Goless handler answering MESSAGE
  printf 'package handlers\n\nimport "net/http"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {\n\tw.Write([]byte("%s"))\n}\n' "$1"
}

set_source() { # FUNCTION SOURCE
  local patch
  patch=$(python3 -c 'import json,sys; print(json.dumps({"spec": {"function": sys.argv[1]}}))' "$2")
  kubectl patch fn "$1" -n "$NS" --type merge -p "$patch" >/dev/null
}

# built_and_rolled FUNCTION [NAMESPACE]: waits until FUNCTION's Deployment carries the built
# template (not the one its pods wait for the first build with) and has rolled to it. A new
# Function is Ready on the pod that waited for its build, switched in place; its Deployment
# then rolls to the built template, and requests sent before that went to a pod the rollout
# replaces.
built_and_rolled() {
  local function=$1 namespace=${2:-$NS}
  template_built() {
    local waiting
    waiting=$(kubectl get deploy "$function" -n "$namespace" -o 'jsonpath={.spec.template.metadata.annotations.wasmless\.io/waiting-for-first-build}') || return 1
    [[ -z $waiting ]]
  }
  wait_until 60 "$function's Deployment to carry the built template" template_built
  kubectl rollout status "deploy/$function" -n "$namespace" --timeout=180s >/dev/null
  # The replaced pod serves on through its drain delay (kube-proxy may still send to it):
  # until it is gone, a request may still be its.
  only_rolled_pods() {
    local pods replicas
    pods=$(kubectl get pods -n "$namespace" -l "wasmless.io/function=$function,wasmless.io/component=runtime" --no-headers 2>/dev/null | wc -l)
    replicas=$(kubectl get deploy "$function" -n "$namespace" -o 'jsonpath={.spec.replicas}')
    [[ $pods == "$replicas" ]]
  }
  wait_until 90 "$function's replaced pods to be gone" only_rolled_pods
}
