#!/usr/bin/env bash
# End to end on the test cluster, as a user would: `kubectl apply`, `kubectl get fn`, curl
# through the Service, Prometheus discovering and scraping the function's pods.
#
#   scripts/cluster.sh up && scripts/build-images.sh | xargs scripts/cluster.sh load
#   e2e/run.sh [STEP...]
#
# Each step stops the run at its first failed check, prints what the cluster holds, and the
# summary line. Besides the cluster it starts, on the pod bridge's gateway address and on
# loopback only, Debian's docker-registry (for storage: oci) and prometheus; it stops them.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/cluster.sh env)"
# helm, as scripts/setup.sh builds it (the helm_install step).
export PATH="${WASMLESS_CACHE:-$HOME/.cache/wasmless}/bin:$PATH"

NS=e2e-functions
GATEWAY=$WASMLESS_CLUSTER_GATEWAY
REGISTRY=$GATEWAY:5000
WORK=$(mktemp -d /tmp/wasmless-e2e.XXXXXX)
PIDS=()
passed=0
current=setup

# ---- reporting -------------------------------------------------------------------------

step() {
  current=$1
  printf '\n--- %s\n' "$1"
}

ok() {
  passed=$((passed + 1))
  echo "ok - $current"
}

fail() {
  echo "FAILED: $*" >&2
  exit 1
}

expect_eq() { # ACTUAL EXPECTED WHAT
  [[ $1 == "$2" ]] || fail "$3: expected '$2', got '$1'"
}

expect_contains() { # TEXT PART WHAT
  [[ $1 == *"$2"* ]] || fail "$3: '$2' not in: $1"
}

# wait_until SECONDS WHAT COMMAND...: polls COMMAND every second until it succeeds.
wait_until() {
  local seconds=$1 what=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "$what: not within ${seconds}s"
    sleep 1
  done
}

diagnostics() {
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
  rm -rf "$WORK"
  if [[ $status == 0 ]]; then echo "$passed passed, 0 failed"; else echo "$passed passed, 1 failed"; fi
  exit "$status"
}
MAIN_PID=$BASHPID
trap finish EXIT

# ---- helpers ---------------------------------------------------------------------------

# Prometheus with Kubernetes service discovery. Debian's prometheus (2.42) is built without
# it ("field kubernetes_sd_configs not found"), so it is built once from the Go module proxy,
# with the build tags that leave out every other discovery plugin (one of them, Nomad's,
# has a dependency the proxy does not serve).
PROMETHEUS_MODULE_VERSION=v0.316.0 # Prometheus 3.x's module versioning
prometheus_binary() {
  local dir=${WASMLESS_CACHE:-$HOME/.cache/wasmless}/tools/prometheus-$PROMETHEUS_MODULE_VERSION
  if [[ ! -x $dir/prometheus ]]; then
    echo "building Prometheus ($PROMETHEUS_MODULE_VERSION) with Kubernetes discovery, once (~3 min)" >&2
    mkdir -p "$dir/module"
    printf 'module wasmless.local/prometheus\n\ngo 1.25.0\n\nrequire github.com/prometheus/prometheus %s\n' \
      "$PROMETHEUS_MODULE_VERSION" >"$dir/module/go.mod"
    (cd "$dir/module" && CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local go build -tags remove_all_sd,enable_kubernetes_sd \
      -trimpath -ldflags "-s -w" -o "$dir/prometheus" github.com/prometheus/prometheus/cmd/prometheus)
  fi
  echo "$dir/prometheus"
}

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

# expect_service_answer FUNCTION EXPECTED: a new Service's answer. Ready is the pods'
# readiness; kube-proxy programs the Service a moment later, and until then its ClusterIP
# refuses connections. Up to 30 s for that, then the answer is checked.
expect_service_answer() {
  local deadline=$((SECONDS + 30))
  until [[ $(get_service "$1" 2>/dev/null) == "$2" ]] || ((SECONDS >= deadline)); do sleep 1; done
  expect_eq "$(get_service "$1")" "$2" "GET through $1's Service"
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

# ---- steps -----------------------------------------------------------------------------

install_operator() {
  step "kubectl apply -k deploy/: the operator is available and one replica holds the Lease"
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
  local chunks
  chunks=$(kubectl get cm -n "$NS" -l "wasmless.io/function=hello,wasmless.io/module-digest" -o name | wc -l)
  [[ $chunks -ge 1 ]] || fail "no module ConfigMaps"
  kubectl wait fn/hello -n "$NS" --for=condition=Ready --timeout=180s >/dev/null
  kubectl rollout status deploy/hello -n "$NS" --timeout=60s >/dev/null
  local table
  table=$(kubectl get fn -n "$NS")
  echo "$table"
  expect_eq "$(awk 'NR == 1 { print $1, $2, $3, $4, $5, $6, $7 }' <<<"$table")" "NAME LANGUAGE PHASE READY DIGEST URL AGE" "kubectl get fn's columns"
  local digest
  digest=$(fn_field hello .status.moduleDigest)
  expect_eq "$(awk '$1 == "hello" { print $2, $3, $4, $5, $6 }' <<<"$table")" \
    "go Ready 1 ${digest:7:10} http://hello.$NS.svc.cluster.local:9000" "kubectl get fn's row"
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
  kubectl rollout status deploy/hello -n "$NS" --timeout=60s >/dev/null
  local newest log
  newest=$(kubectl get pods -n "$NS" -l wasmless.io/function=hello --sort-by=.metadata.creationTimestamp -o name | tail -1)
  log=$(kubectl logs -n "$NS" "$newest")
  expect_contains "$log" '"compiled_code":"precompiled"' "the new pod's module load"
  [[ $log != *"not using the precompiled code"* ]] || fail "the new pod fell back to compiling: $log"
  echo "    $(grep -o '"load_ms":[0-9.]*' <<<"$log" | head -1) in $newest"
  kubectl patch fn hello -n "$NS" --type merge -p "{\"spec\":{\"replicas\":${replicas:-1}}}" >/dev/null
  ok
}

prometheus_scrapes() {
  step "Prometheus discovers the function's pods through the API server and counts the requests sent"
  local port=19090 sent=5 i
  # The configuration users copy, pointed at this cluster from outside it.
  sed -e "s|      - role: pod|      - role: pod\n        api_server: https://$GATEWAY:6443\n        tls_config: {ca_file: $WASMLESS_CLUSTER_DIR/pki/ca.crt, cert_file: $WASMLESS_CLUSTER_DIR/pki/prometheus.crt, key_file: $WASMLESS_CLUSTER_DIR/pki/prometheus.key}|" \
    -e 's|scrape_interval: 15s|scrape_interval: 1s|' deploy/prometheus/prometheus.yml >"$WORK/prometheus.yml"
  local prometheus
  prometheus=$(prometheus_binary) # built before it is started, not inside the background job
  "$prometheus" --config.file "$WORK/prometheus.yml" --storage.tsdb.path "$WORK/prometheus" \
    --web.listen-address "127.0.0.1:$port" >"$WORK/prometheus.log" 2>&1 &
  PIDS+=($!)
  # The pods count what they served since they started, and earlier steps scale hello up
  # and down: what Prometheus sees first is the baseline, the requests sent add to it.
  value_of() {
    curl -fsS "http://127.0.0.1:$port/api/v1/query" --data-urlencode "query=$1" |
      python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "none")'
  }
  # A pod still terminating from an earlier step's scale-down (it serves on through the
  # runtime's drain delay) would leave the sum after the baseline and take its count along.
  no_terminating_pods() {
    [[ -z $(kubectl get pods -n "$NS" -l wasmless.io/function=hello,wasmless.io/component=runtime \
      -o 'jsonpath={.items[*].metadata.deletionTimestamp}') ]]
  }
  wait_until 120 "hello's terminating pods to go" no_terminating_pods
  # Every pod of hello scraped, so the baseline holds all they counted.
  pods_scraped() {
    local pods
    pods=$(kubectl get pods -n "$NS" -l wasmless.io/function=hello,wasmless.io/component=runtime --no-headers | wc -l)
    [[ $(value_of "count(wasmless_module_info{namespace=\"$NS\",function=\"hello\"})") == "$pods" ]]
  }
  wait_until 90 "Prometheus to scrape hello's pods" pods_scraped
  # This namespace's hello only: cli_deploy's hello, in a namespace still being deleted,
  # may be scraped too, and its count taken for the baseline.
  local query="sum(wasmless_requests_total{namespace=\"$NS\",function=\"hello\"})" baseline
  baseline=$(value_of "$query")
  [[ $baseline == none ]] && baseline=0
  local url
  url=$(service_url hello)
  for ((i = 0; i < sent; i++)); do get "$url" >/dev/null; done
  scraped_within() {
    local deadline=$((SECONDS + $1))
    until scraped 2>/dev/null; do
      ((SECONDS < deadline)) || return 1
      sleep 1
    done
  }
  scraped() {
    local value
    value=$(value_of "$query")
    echo "$query = $value (baseline $baseline, $sent sent)" >"$WORK/scraped"
    [[ $value == "$((baseline + sent))" ]]
  }
  if ! scraped_within 90; then
    tail -20 "$WORK/prometheus.log"
    fail "Prometheus's count of the requests sent: $(cat "$WORK/scraped")"
  fi
  cat "$WORK/scraped"
  ok
}

# The handler the dashboard step sends varied requests to: 200s, a 404 and a 500 it answers,
# and an exit without an answer, which the runtime counts as a trap of kind exit (a panic
# would not do: the Go SDK turns one into a 500 answer).
dash_handler() {
  printf '%s\n' 'package handlers' '' 'import (' '	"net/http"' '	"os"' ')' '' \
    'func Handler(w http.ResponseWriter, r *http.Request) {' \
    '	switch r.URL.Path {' \
    '	case "/missing":' '		http.NotFound(w, r)' \
    '	case "/fail":' '		http.Error(w, "failed on purpose", http.StatusInternalServerError)' \
    '	case "/exit":' '		os.Exit(3)' \
    '	default:' '		w.Write([]byte("ok"))' \
    '	}' '}'
}

dashboard_queries() {
  step "every query of the Grafana dashboard parses and returns data from Prometheus, after varied requests and a failed build"
  local prometheus=http://127.0.0.1:19090 start
  start=$(date +%s)
  curl -fsS "$prometheus/-/ready" >/dev/null || fail "no Prometheus at $prometheus: run the prometheus_scrapes step first"
  # Created now, while Prometheus scrapes the operator, so that its build counters are seen
  # at 0 before the builds end.
  local source
  source=$(dash_handler | sed 's/^/    /')
  printf 'apiVersion: wasmless.io/v1alpha1\nkind: Function\nmetadata: {name: dash}\nspec:\n  language: go\n  source: |\n%s\n' \
    "$source" | kubectl apply -n "$NS" -f - >/dev/null
  source=$(printf 'package handlers\n\nimport "net/http"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {\n\tundefinedHelper(w)\n}\n' | sed 's/^/    /')
  printf 'apiVersion: wasmless.io/v1alpha1\nkind: Function\nmetadata: {name: dash-broken}\nspec:\n  language: go\n  source: |\n%s\n' \
    "$source" | kubectl apply -n "$NS" -f - >/dev/null
  kubectl wait fn/dash -n "$NS" --for=condition=Ready --timeout=600s >/dev/null
  wait_until 600 "dash-broken's build to fail" phase_is dash-broken Failed
  prometheus_has() {
    curl -fsS "$prometheus/api/v1/query" --data-urlencode "query=$1" |
      python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["data"]["result"] else 1)'
  }
  wait_until 60 "Prometheus to scrape dash's pod" prometheus_has 'wasmless_module_info{function="dash"}'
  wait_until 60 "Prometheus to scrape the operator's replicas of dash" prometheus_has 'wasmless_function_replicas{function="dash",state="ready"} == 1'
  wait_until 60 "Prometheus to see dash-broken's failed build" prometheus_has 'wasmless_operator_builds_total{function="dash-broken",result="failed"} == 1'
  local url round i code big
  url=$(service_url dash)
  big=$(head -c 70000 /dev/zero | tr '\0' a)
  # Rounds a few scrapes apart, so that rates and increases have more than one sample.
  for round in 1 2 3 4 5 6; do
    for ((i = 0; i < 20; i++)); do get "$url" >/dev/null; done
    expect_eq "$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 "${url}missing")" 404 "GET /missing"
    expect_eq "$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 "${url}fail")" 500 "GET /fail"
    expect_eq "$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 "${url}exit")" 500 "GET /exit (a trap)"
    # Headers over --max-header-size (64 KiB): refused by the edge, counted as header_too_large.
    code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 -H "X-Padding: $big" "$url" || true)
    expect_eq "$code" 431 "a request with 70 kB of headers"
    sleep 3
  done
  expect_eq "$(get "$url")" ok "GET / after the traps"
  sleep 3 # the last round scraped
  local range=$(($(date +%s) - start + 60))s
  python3 e2e/dashboard_queries.py --prometheus "$prometheus" --range "$range" --rate-interval 1m ||
    fail "some panels of deploy/grafana/wasmless.json have no data (above)"
  if [[ -n ${WASMLESS_DASHBOARD_PICTURE:-} ]]; then
    "${WASMLESS_PICTURE_PYTHON:-python3}" e2e/dashboard_picture.py --prometheus "$prometheus" \
      --start "$((start - 60))" --out "$WASMLESS_DASHBOARD_PICTURE"
  fi
  kubectl delete fn dash dash-broken -n "$NS" --wait=true >/dev/null
  ok
}

rolling_update() {
  step "a source change: one new build, a rolling update with zero failed requests, old pods gone"
  local before
  before=$(fn_field hello .status.moduleDigest)
  # Requests through the Service, one connection each, for as long as the update runs.
  local url
  url=$(service_url hello)
  (
    while [[ ! -f $WORK/stop ]]; do
      if body=$(get "$url" 2>&1); then echo "ok $body"; else echo "FAIL $body"; fi
      sleep 0.05
    done
  ) >"$WORK/requests.log" &
  PIDS+=($!)
  local loop=$!
  set_source hello "$(go_handler 'v2')"
  module_changed() { [[ $(fn_field hello .status.moduleDigest) != "$before" ]]; }
  wait_until 600 "the new module" module_changed
  kubectl wait fn/hello -n "$NS" --for=condition=Ready --timeout=180s >/dev/null
  kubectl rollout status deploy/hello -n "$NS" --timeout=120s >/dev/null
  only_running_pods() { ! kubectl get pods -n "$NS" -l wasmless.io/function=hello,wasmless.io/component=runtime --no-headers | grep -v Running; }
  wait_until 120 "the old pods to go" only_running_pods
  sleep 2
  touch "$WORK/stop"
  wait "$loop" || true
  local total failed
  total=$(wc -l <"$WORK/requests.log")
  failed=$(grep -c '^FAIL' "$WORK/requests.log" || true)
  echo "$total requests during the update, $failed failed; last answer: $(tail -1 "$WORK/requests.log")"
  grep '^FAIL' "$WORK/requests.log" | head -5 || true
  expect_eq "$failed" 0 "failed requests during the rolling update"
  expect_eq "$(tail -1 "$WORK/requests.log")" "ok v2" "the answer after the update"
  # One build for the new source; the old build's Job is collected once the new module serves.
  local source
  source=$(fn_field hello .status.sourceDigest)
  expect_eq "$(kubectl get jobs -n "$NS" -l "wasmless.io/function=hello" -o name)" "job.batch/hello-build-${source:7:10}" "build Jobs of hello after one change"
  expect_eq "$(kubectl get pods -n "$NS" -l wasmless.io/function=hello,wasmless.io/component=runtime --no-headers | wc -l)" 1 "runtime pods"
  ok
}

compile_error() {
  step "a compile error: phase Failed, the compiler's message on status and in an Event, v2 keeps answering"
  set_source hello "$(printf 'package handlers\n\nimport "net/http"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {\n\tundefinedHelper(w)\n}\n')"
  wait_until 600 "phase Failed" phase_is hello Failed
  local message
  message=$(fn_field hello .status.buildMessage)
  echo "buildMessage: $message"
  expect_contains "$message" "undefined: undefinedHelper" "status.buildMessage"
  local events
  events=$(kubectl get events -n "$NS" --field-selector involvedObject.name=hello -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}')
  expect_contains "$events" "undefined: undefinedHelper" "the BuildFailed Event"
  expect_eq "$(get_service hello)" "v2" "the previous version after a failed build"
  ok
}

oci_storage() {
  step "the Rust example with storage: oci: built, pushed to a registry, pulled by digest"
  mkdir -p "$WORK/registry"
  printf 'version: 0.1\nlog: {level: warn}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: "%s"}\n' \
    "$WORK/registry" "$REGISTRY" >"$WORK/registry.yml"
  docker-registry serve "$WORK/registry.yml" >"$WORK/registry.log" 2>&1 &
  PIDS+=($!)
  wait_until 30 "the registry" curl -fsS "http://$REGISTRY/v2/"
  sed 's/^  language: rust$/  language: rust\n  storage: oci/' examples/hello-rust/function.yaml | kubectl apply -n "$NS" -f - >/dev/null
  settled() { [[ $(fn_field hello-rust .status.phase) =~ ^(Ready|Failed)$ ]]; }
  wait_until 900 "hello-rust Ready or Failed" settled
  phase_is hello-rust Ready || fail "hello-rust: $(fn_field hello-rust .status.buildMessage)"
  expect_service_answer hello-rust "Hello from Rust!"
  local args
  args=$(kubectl get deploy hello-rust -n "$NS" -o 'jsonpath={.spec.template.spec.containers[0].args}')
  expect_contains "$args" "oci://$REGISTRY/$NS/hello-rust@sha256:" "the runtime's --module"
  [[ -n $(curl -fsS "http://$REGISTRY/v2/$NS/hello-rust/tags/list") ]] || fail "nothing in the registry"
  ok
}

failover() {
  step "the operator's leader deleted mid-build: it releases the Lease on SIGTERM, the other replica takes it at once and finishes the build, with no second Job"
  set_source hello "$(go_handler 'v3')"
  wait_until 60 "phase Building" phase_is hello Building
  local old_leader digest
  old_leader=$(leader)
  digest=$(fn_field hello .status.sourceDigest)
  # Every write of the Lease from here on, in order (holder|renewTime): the old leader's
  # renewals, its release (no holder), the new leader's acquisition. The first line is the
  # Lease as it is now; later writes are watched from that version on.
  kubectl get lease wasmless-operator -n wasmless-system --watch \
    -o 'jsonpath={.spec.holderIdentity}{"|"}{.spec.renewTime}{"\n"}' >"$WORK/lease.log" 2>&1 &
  PIDS+=($!)
  local watch=$!
  wait_until 10 "the watch of the Lease" test -s "$WORK/lease.log"
  local deleted=$SECONDS
  kubectl delete pod "$old_leader" -n wasmless-system --wait=false >/dev/null
  new_leader() {
    local holder
    holder=$(kubectl get lease wasmless-operator -n wasmless-system -o 'jsonpath={.spec.holderIdentity}')
    [[ -n $holder && $holder != "$old_leader" ]]
  }
  # Released, the Lease is taken at a standby's next try (every 5 s). Unreleased, it could be
  # taken only 15 s after its last renewal (every 5 s): 10 s after the delete at the earliest,
  # and then straight from the old holder, which the watch below would show.
  wait_until 10 "a new leader before the Lease could expire" new_leader
  echo "    new leader $(leader) $((SECONDS - deleted))s after deleting $old_leader"
  sleep 1 # the watch prints the acquisition
  kill "$watch" 2>/dev/null || true
  sed 's/^/    lease: /' "$WORK/lease.log"
  # The release itself: the holder emptied between the old leader and the new one.
  local released
  released=$(awk -F'|' -v old="$old_leader" '
    $1 == old && !cleared { seen_old = 1 }
    $1 == "" && seen_old { cleared = 1 }
    $1 != "" && $1 != old && cleared { print "yes"; exit }' "$WORK/lease.log")
  expect_eq "$released" yes "the Lease released (no holder) by $old_leader before another replica took it"
  local url
  url=$(service_url hello)
  answers_v3() { [[ $(get "$url") == v3 ]]; }
  wait_until 600 "v3 to answer" answers_v3
  local short=${digest#sha256:}
  short=${short:0:10}
  expect_eq "$(kubectl get jobs -n "$NS" -l "wasmless.io/source-digest=$short" -o name | wc -l)" 1 "Jobs for the v3 source"
  phase_is hello Ready || fail "phase $(fn_field hello .status.phase) after the failover"
  ok
}

OPERATOR_ACCOUNT=system:serviceaccount:wasmless-system:wasmless-operator

# new_function NAME MESSAGE: applies a Go Function answering MESSAGE.
new_function() {
  local source
  source=$(go_handler "$2" | sed 's/^/    /')
  printf 'apiVersion: wasmless.io/v1alpha1\nkind: Function\nmetadata: {name: %s}\nspec:\n%s  source: |\n%s\n' \
    "$1" "${3:-}" "$source" | kubectl apply -n "$NS" -f - >/dev/null
}

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

cli_deploy() {
  step "wasmless deploy, get and logs: a URL that answers This works!, the compiler's message for a broken handler"
  local wasmless=${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}/release/wasmless ns=e2e-cli out url
  kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  out=$("$wasmless" deploy examples/hello-go -n "$ns" --timeout 10m)
  echo "$out"
  url=$(awk '/^From a node: / { print $4 }' <<<"$out")
  [[ -n $url ]] || fail "wasmless deploy printed no address: $out"
  # deploy waits for the Service's endpoints; kube-proxy programs a new Service a moment later.
  wait_until 10 "the address wasmless deploy printed to answer" get "$url"
  expect_eq "$(get "$url")" "This works!" "GET of the URL wasmless deploy printed"
  # A bare handler with a syntax error: a Function named after its directory, Failed.
  mkdir -p "$WORK/broken-greeter"
  printf 'package handlers

import "net/http"

func Handler(w http.ResponseWriter, r *http.Request) {
	w.Write([]byte("hi")
}
' \
    >"$WORK/broken-greeter/handler.go"
  local status=0
  out=$("$wasmless" deploy "$WORK/broken-greeter" -n "$ns" --timeout 10m 2>&1) || status=$?
  echo "$out" | tail -3
  [[ $status -ne 0 ]] || fail "wasmless deploy of a broken handler exited 0"
  expect_contains "$out" "Function broken-greeter failed (BuildFailed)" "wasmless deploy's error"
  expect_contains "$out" "syntax error" "the compiler's message"
  [[ $out != *backtrace* ]] || fail "wasmless deploy printed a backtrace: $out"
  out=$("$wasmless" get -n "$ns")
  echo "$out"
  expect_eq "$(awk '$1 == "hello" { print $2, $3, $4 }' <<<"$out")" "go Ready 1" "wasmless get's hello row"
  expect_eq "$(awk '$1 == "broken-greeter" { print $3 }' <<<"$out")" "Failed" "wasmless get's broken-greeter row"
  out=$("$wasmless" logs hello -n "$ns" --tail 5)
  expect_contains "$out" '"message":"request"' "wasmless logs hello"
  expect_contains "$out" "[hello-" "wasmless logs' pod prefix"
  kubectl delete namespace "$ns" --wait=false >/dev/null
  ok
}

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
  expect_contains "$refused" "function pods run as the default ServiceAccount, without its token" "function pods as another account, as the operator"
  refused=$(probe_deployment default true | dry_run_as_operator)
  expect_contains "$refused" "function pods run as the default ServiceAccount, without its token" "function pods with a token, as the operator"
  expect_contains "$(probe_deployment default false | dry_run_as_operator)" "created (server dry run)" "function pods as the default account without a token, as the operator"
  # The operator's own writes pass it: the builder RBAC it wrote for hello is there.
  expect_eq "$(kubectl get role wasmless-builder -n "$NS" -o 'jsonpath={.rules[0].verbs}')" '["create","patch"]' \
    "the builder Role's verbs"
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
  expect_contains "$(kubectl get deploy hello -n "$NS" -o 'jsonpath={.spec.template.spec.containers[0].args}')" \
    "SEEN_AFTER_CLASH=1" "hello's runtime arguments after the change"
  phase_is clash Failed || fail "clash: phase $(fn_field clash .status.phase)"
  kubectl delete fn clash -n "$NS" >/dev/null
  # The next steps start from hello served and rolled out.
  kubectl wait fn/hello -n "$NS" --for=condition=Ready --timeout=180s >/dev/null
  kubectl rollout status deploy/hello -n "$NS" --timeout=120s >/dev/null
  ok
}

rename_service() {
  step "spec.service renamed: the Service moves to the new name, the old one is deleted"
  kubectl patch fn hello -n "$NS" --type merge -p '{"spec": {"service": "greeter"}}' >/dev/null
  old_service_gone() { ! kubectl get svc hello -n "$NS" >/dev/null 2>&1; }
  wait_until 60 "the old Service hello to go" old_service_gone
  kubectl get svc greeter -n "$NS" >/dev/null || fail "no Service greeter"
  url_is_greeter() { [[ $(fn_field hello .status.url) == "http://greeter.$NS.svc.cluster.local:9000" ]]; }
  wait_until 30 "status.url on greeter" url_is_greeter
  ready_available() { [[ $(fn_field hello '.status.conditions[?(@.type=="Ready")].reason') == Available ]]; }
  wait_until 30 "Ready's reason Available" ready_available
  # kube-proxy programs the new Service's address a moment after it exists.
  answers_through_greeter() { [[ $(get_service hello) == "This works!" ]]; }
  wait_until 30 "This works! through the Service greeter" answers_through_greeter
  ok
}

delete_function() {
  step "kubectl delete fn: its Deployment, Service, Jobs and ConfigMaps are collected"
  kubectl delete fn hello -n "$NS" --wait=true >/dev/null
  collected() { ! kubectl get deploy,svc,jobs,cm -n "$NS" -l wasmless.io/function=hello --no-headers 2>/dev/null | grep -q .; }
  wait_until 120 "garbage collection" collected
  expect_eq "$(kubectl get cm -n "$NS" -o name | grep -cE '^configmap/hello-(source|module)-' || true)" 0 "ConfigMaps of hello"
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
  builder_running() { kubectl get pods -n "$NS" -l wasmless.io/function=doomed --field-selector=status.phase=Running -o name | grep -q .; }
  wait_until 120 "the builder of doomed to run" builder_running
  local uid env
  uid=$(kubectl get fn doomed -n "$NS" -o 'jsonpath={.metadata.uid}')
  env=$(kubectl get jobs -n "$NS" -l wasmless.io/function=doomed -o 'jsonpath={.items[0].spec.template.spec.containers[0].env[?(@.name=="WASMLESS_FUNCTION_UID")].value}')
  expect_eq "$env" "$uid" "the build Job's WASMLESS_FUNCTION_UID"
  kubectl delete fn doomed -n "$NS" --wait=false >/dev/null
  nothing_left() {
    ! kubectl get cm,jobs,pods -n "$NS" -l wasmless.io/function=doomed --no-headers 2>/dev/null | grep -q . &&
      ! kubectl get cm -n "$NS" -o name | grep -q '^configmap/doomed-'
  }
  wait_until 120 "everything of doomed collected" nothing_left
  # A builder that published after the deletion would show now: its chunks are collected too.
  sleep 10
  nothing_left || fail "left behind: $(kubectl get cm,jobs,pods -n "$NS" -o name | grep doomed)"
  ok
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

# ---- Helm --------------------------------------------------------------------------------

operator_pods_ready() { # N: the operator Deployment has N replicas, all ready and updated
  local deploy
  deploy=$(kubectl get deploy wasmless-operator -n wasmless-system \
    -o 'jsonpath={.spec.replicas} {.status.readyReplicas} {.status.updatedReplicas} {.status.replicas}')
  [[ $deploy == "$1 $1 $1 $1" ]]
}

helm_install() {
  step "helm install of deploy/helm/wasmless over deploy/: a new Function built and served; helm upgrade to 1 operator replica, still serving"
  command -v helm >/dev/null || fail "helm is missing: scripts/setup.sh builds it"
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

steps=(install_operator goless_sample new_pod_precompiled scale_and_autoscale autoscale_on_cpu cli_deploy least_privilege prometheus_scrapes dashboard_queries port_clash rename_service rolling_update
  compile_error oci_storage failover delete_function build_deadline delete_during_build namespaced_install helm_install)
# Steps build on each other; naming some (`e2e/run.sh install_operator goless_sample`) runs only those.
for name in "${@:-${steps[@]}}"; do
  [[ " ${steps[*]} " == *" $name "* ]] || fail "no step $name; the steps are: ${steps[*]}"
  "$name"
done
