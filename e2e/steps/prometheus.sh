# Prometheus, built with Kubernetes discovery, scraping the pods as deploy/prometheus/ tells
# it to, and every query of the Grafana dashboard answered.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

prometheus_scrapes() {
  step "Prometheus discovers the function's pods through the API server and counts the requests sent"
  local port=19090 sent=5 i
  # The configuration users copy, pointed at this cluster from outside it.
  sed -e "s|      - role: pod|      - role: pod\n        api_server: https://$GATEWAY:6443\n        tls_config: {ca_file: $WASMLESS_CLUSTER_DIR/pki/ca.crt, cert_file: $WASMLESS_CLUSTER_DIR/pki/prometheus.crt, key_file: $WASMLESS_CLUSTER_DIR/pki/prometheus.key}|" \
    -e 's|scrape_interval: 15s|scrape_interval: 1s|' deploy/prometheus/prometheus.yml >"$WORK/prometheus.yml"
  local prometheus
  prometheus=$(prometheus_tool) # built before it is started, not inside the background job
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
  # And one with no pod of its own, so that the pool's panels have a load to show.
  printf 'apiVersion: wasmless.io/v1alpha1\nkind: Function\nmetadata: {name: dash-idle}\nspec:\n  language: go\n  scale: {min: 0}\n  source: |\n%s\n' \
    "$(go_handler "dash idle" | sed 's/^/    /')" | kubectl apply -n "$NS" -f - >/dev/null
  kubectl wait fn/dash -n "$NS" --for=condition=Ready --timeout=600s >/dev/null
  kubectl wait fn/dash-idle -n "$NS" --for=condition=Ready --timeout=600s >/dev/null
  expect_service_answer dash-idle "dash idle"
  wait_until 600 "dash-broken's build to fail" phase_is dash-broken Failed
  prometheus_has() {
    curl -fsS "$prometheus/api/v1/query" --data-urlencode "query=$1" |
      python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["data"]["result"] else 1)'
  }
  wait_until 60 "Prometheus to scrape dash's pod" prometheus_has 'wasmless_module_info{function="dash"}'
  wait_until 60 "Prometheus to scrape the operator's replicas of dash" prometheus_has 'wasmless_function_replicas{function="dash",state="ready"} == 1'
  wait_until 60 "Prometheus to see dash-broken's failed build" prometheus_has 'wasmless_operator_builds_total{function="dash-broken",result="failed"} == 1'
  # The pool loads a Function as soon as its entry appears: when this step made the pool (no
  # step before it did), that load came before Prometheus first scraped the pool. One more
  # pooled Function, loaded after that scrape, gives the load-time panel an increase to show.
  wait_until 60 "Prometheus to scrape the pool" prometheus_has 'wasmless_pool_load_seconds_count'
  printf 'apiVersion: wasmless.io/v1alpha1\nkind: Function\nmetadata: {name: dash-idle-later}\nspec:\n  language: go\n  scale: {min: 0}\n  source: |\n%s\n' \
    "$(go_handler "dash idle later" | sed 's/^/    /')" | kubectl apply -n "$NS" -f - >/dev/null
  kubectl wait fn/dash-idle-later -n "$NS" --for=condition=Ready --timeout=600s >/dev/null
  expect_service_answer dash-idle-later "dash idle later"
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
  kubectl delete fn dash dash-broken dash-idle-later -n "$NS" --wait=true >/dev/null
  ok
}
