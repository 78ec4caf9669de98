# Scale to zero (issue 24): a Function with scale.min 0 has no pod of its own and answers
# from its namespace's shared pool at once; under load it gets pods of its own, and back to
# none when idle, with a request loop running throughout that sees no failure.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

own_pods() { # FUNCTION: its runtime pods, ready or not
  kubectl get pods -n "$NS" -l "wasmless.io/function=$1,wasmless.io/component=runtime" --no-headers 2>/dev/null | wc -l
}

served_by_is() { [[ $(fn_field "$1" .status.servedBy) == "$2" ]]; }

pool_ips() {
  kubectl get pods -n "$NS" -l wasmless.io/component=pool \
    -o 'jsonpath={range .items[?(@.status.podIP)]}{.status.podIP}{"\n"}{end}'
}

# pool_lists FUNCTION: every pool pod lists FUNCTION in its GET /pool.
pool_lists() {
  local ip ips
  ips=$(pool_ips)
  [[ -n $ips ]] || return 1
  for ip in $ips; do
    [[ $(curl -fsS --max-time 2 "http://$ip:9090/pool") == *"\"$1\""* ]] || return 1
  done
}

# pool_forgot FUNCTION: no pool pod lists FUNCTION any more.
pool_forgot() {
  local ip
  for ip in $(pool_ips); do
    [[ $(curl -fsS --max-time 2 "http://$ip:9090/pool") != *"\"$1\""* ]] || return 1
  done
}

# served_requests FUNCTION COMPONENT: the requests FUNCTION's series count, summed over the
# ready pods of COMPONENT (runtime: its own pods; pool: the pool's), from their /metrics.
served_requests() {
  local ips selector="wasmless.io/component=$2"
  [[ $2 == runtime ]] && selector="wasmless.io/function=$1,$selector"
  ips=$(kubectl get pods -n "$NS" -l "$selector" \
    -o 'jsonpath={range .items[?(@.status.podIP)]}{.status.podIP}{"\n"}{end}')
  for ip in $ips; do
    curl -fsS --max-time 2 "http://$ip:9090/metrics" || true
  done | awk -v fn="function=\"$1\"" '/^wasmless_requests_total\{/ && index($0, fn) { sum += $NF } END { print sum + 0 }'
}

# request_loop URL LOG: one new connection every 50 ms until killed; each line `code seconds`.
request_loop() {
  while :; do
    curl -s -o /dev/null --max-time 5 -w '%{http_code} %{time_total}\n' "$1" || echo "000 curl-exit-$?"
    sleep 0.05
  done >"$2"
}

# waiting_handler MESSAGE: a Goless handler that waits 10 ms, as one calling a database
# would, then answers MESSAGE. The autoscaler reads concurrency inside the runtime (Little's
# law on the time requests take there): a handler answering in half a millisecond shows it a
# small fraction of what the clients hold open, and the ramp below would sit on the target.
waiting_handler() {
  printf 'package handlers\n\nimport (\n\t"net/http"\n\t"time"\n)\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {\n\ttime.Sleep(10 * time.Millisecond)\n\tw.Write([]byte("%s"))\n}\n' "$1"
}

scale_to_zero() {
  step "scale.min 0: no pod of its own, answered from the pool; 0 -> N pods -> 0 under a load ramp with no failed request"
  local started manifest url ttfb
  manifest=$(python3 -c 'import json,sys; print(json.dumps({
    "apiVersion": "wasmless.io/v1alpha1", "kind": "Function",
    "metadata": {"name": "idle", "namespace": sys.argv[2]},
    "spec": {"function": sys.argv[1], "scale": {"min": 0, "max": 3, "targetConcurrency": 2, "idleTimeout": "15s"}}}))' \
    "$(waiting_handler "idle but awake")" "$NS")
  started=$SECONDS
  kubectl apply -f - <<<"$manifest" >/dev/null
  wait_until 240 "idle to be Ready" phase_is idle Ready
  echo "    Ready $((SECONDS - started))s after kubectl apply"
  expect_eq "$(fn_field idle .status.servedBy)" pool "idle's status.servedBy"
  expect_eq "$(own_pods idle)" 0 "idle's pods of its own"
  kubectl get fn idle -n "$NS"
  expect_eq "$(kubectl get fn idle -n "$NS" --no-headers | awk '{ print $5 }')" pool "kubectl get fn's SERVED"
  url=$(service_url idle)
  # So that the request below is the Function's first.
  wait_for_connections "$url" "idle's ClusterIP"
  # The first request after Ready: the pool loaded the module and code when the Function
  # joined its table (--pool-load-ahead), or loads them on this request.
  ttfb=$(curl -fsS -o "$WORK/idle.body" --max-time 5 -w '%{time_starttransfer}' "$url")
  expect_eq "$(cat "$WORK/idle.body")" "idle but awake" "the first answer, from the pool"
  echo "    first request from zero: time to first byte ${ttfb}s (10 ms of it the handler's own wait)"

  # A request loop throughout (new connections, so each follows the Service's route), and a
  # load ramp on top: wrk at 1, then 12 connections.
  request_loop "$url" "$WORK/idle-loop.log" &
  PIDS+=($!)
  local loop=$! load
  wrk -t1 -c1 -d5s "$url" >"$WORK/wrk-idle-1.log" 2>&1
  started=$SECONDS
  # A request slower than wrk's default 2 s is late, not failed (this node's 2 cores run the
  # cluster, the pods and wrk): 10 s, and the latencies are printed.
  wrk -t2 -c12 -d300s --timeout 10s --latency "$url" >"$WORK/wrk-idle-12.log" 2>&1 &
  PIDS+=($!)
  load=$!
  has_pods() { served_by_is idle pods && (($(ready_pods idle) >= 1)); }
  wait_until 120 "idle to get pods of its own under load, and the Service to route to them" has_pods
  echo "    $(ready_pods idle) pods of its own, routed to, $((SECONDS - started))s into the load"
  # wrk's keep-alive connections move too: the pool answers a Function served by its pods
  # with Connection: close, so they reconnect through the Service, to the pods.
  local pods_before pool_before pods_took pool_took
  pods_before=$(served_requests idle runtime)
  pool_before=$(served_requests idle pool)
  sleep 10
  pods_took=$(($(served_requests idle runtime) - pods_before))
  pool_took=$(($(served_requests idle pool) - pool_before))
  echo "    in the 10 s after the move: $pods_took requests served by idle's pods, $pool_took by the pool"
  ((pods_took > pool_took)) || fail "the load stayed on the pool after the move to pods ($pool_took there, $pods_took on the pods)"
  kill -INT "$load"
  wait "$load" 2>/dev/null || true
  grep -E 'Requests/sec|requests in|Non-2xx|Socket errors|Latency  | 50%| 99%' "$WORK/wrk-idle-12.log" | sed 's/^ */    wrk: /' || true
  if grep -qE 'Non-2xx|Socket errors' "$WORK/wrk-idle-12.log"; then
    fail "wrk saw failed requests during the ramp: $(grep -E 'Non-2xx|Socket errors' "$WORK/wrk-idle-12.log")"
  fi
  started=$SECONDS
  back_to_zero() { served_by_is idle pool && (($(own_pods idle) == 0)); }
  wait_until 180 "idle back to the pool and no pod of its own after 15 s idle" back_to_zero
  echo "    back to zero pods $((SECONDS - started))s after the load stopped (idleTimeout 15s, then 10s for the route to settle, then the pods' drain)"
  sleep 2
  kill "$loop" 2>/dev/null || true
  local total failed
  total=$(wc -l <"$WORK/idle-loop.log")
  failed=$(grep -vc '^200 ' "$WORK/idle-loop.log" || true)
  echo "    the request loop: $total requests, $failed failed"
  ((total > 100)) || fail "the request loop made only $total requests"
  expect_eq "$failed" 0 "failed requests in the loop ($(grep -v '^200 ' "$WORK/idle-loop.log" | sort | uniq -c | head -3))"
  kubectl get events -n "$NS" --field-selector involvedObject.name=idle -o custom-columns=REASON:.reason,MESSAGE:.message --no-headers |
    grep -E 'Scaled|ServedByPool|Available' | sed -n '1,8s/^/    event: /p'
  expect_contains "$(kubectl get events -n "$NS" --field-selector involvedObject.name=idle -o jsonpath='{.items[*].reason}')" ScaledUp "idle's Events"

  # Deleting the Function removes it from the pool within seconds.
  pool_lists idle || fail "the pool does not list idle before its deletion"
  started=$SECONDS
  kubectl delete fn idle -n "$NS" --wait=false >/dev/null
  wait_until 30 "the pool to forget idle" pool_forgot idle
  echo "    gone from the pool $((SECONDS - started))s after kubectl delete"
  ok
}

pooled_secret() {
  step "scale.min 0 and env from a Secret and a ConfigMap: served by the pool, which may read that Secret and no other; a rotation reaches the pool with no failed request"
  kubectl create secret generic pool-greeting -n "$NS" --from-literal=text=first >/dev/null
  kubectl create secret generic pool-unrelated -n "$NS" --from-literal=text=nobody >/dev/null
  kubectl create configmap pool-settings -n "$NS" --from-literal=PUNCTUATION='!' >/dev/null
  local source manifest started
  source=$(printf 'package handlers\n\nimport (\n\t"net/http"\n\t"os"\n)\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {\n\tw.Write([]byte(os.Getenv("GREETING") + os.Getenv("PUNCTUATION")))\n}\n')
  manifest=$(python3 -c 'import json,sys; print(json.dumps({
    "apiVersion": "wasmless.io/v1alpha1", "kind": "Function",
    "metadata": {"name": "pooled-secretive", "namespace": sys.argv[2]},
    "spec": {"source": sys.argv[1], "scale": {"min": 0},
             "env": [{"name": "GREETING", "valueFrom": {"secretKeyRef": {"name": "pool-greeting", "key": "text"}}}],
             "envFrom": [{"configMapRef": {"name": "pool-settings"}}]}}))' "$source" "$NS")
  started=$SECONDS
  kubectl apply -f - <<<"$manifest" >/dev/null
  wait_until 240 "pooled-secretive to be Ready" phase_is pooled-secretive Ready
  echo "    Ready $((SECONDS - started))s after kubectl apply"
  expect_eq "$(fn_field pooled-secretive .status.servedBy)" pool "pooled-secretive's status.servedBy"
  expect_eq "$(own_pods pooled-secretive)" 0 "pooled-secretive's pods of its own"
  expect_service_answer pooled-secretive "first!"

  # The pool's identity: get on the Secret a pooled Function reads, nothing more.
  local pool_sa="system:serviceaccount:$NS:wasmless-pool"
  expect_eq "$(kubectl auth can-i get secret/pool-greeting -n "$NS" --as="$pool_sa")" yes "the pool may get the Secret its Function reads"
  expect_eq "$(kubectl auth can-i get secret/pool-unrelated -n "$NS" --as="$pool_sa" || true)" no "the pool may get a Secret no pooled Function reads"
  expect_eq "$(kubectl auth can-i list secrets -n "$NS" --as="$pool_sa" || true)" no "the pool may list Secrets"
  local objects
  objects=$(kubectl get fn/pooled-secretive deploy/pooled-secretive role/wasmless-pool -n "$NS" -o yaml
    kubectl get cm -n "$NS" -l wasmless.io/function=pooled-secretive -o yaml)
  [[ $objects != *first* ]] || fail "the Secret's value appears in the Function, its Deployment, the pool's Role or its ConfigMaps"

  local url
  url=$(service_url pooled-secretive)
  request_loop "$url" "$WORK/pooled-secret.log" &
  PIDS+=($!)
  local loop=$!
  sleep 1
  local patched=$SECONDS
  kubectl patch secret pool-greeting -n "$NS" --type merge -p '{"stringData":{"text":"second"}}' >/dev/null
  answers_second() { [[ $(get "$url" 2>/dev/null) == "second!" ]]; }
  wait_until 30 "the pool to answer with the new value" answers_second
  echo "    the pool answered with the new value $((SECONDS - patched))s after the patch"
  sleep 1
  kill "$loop" 2>/dev/null || true
  wait "$loop" 2>/dev/null || true
  local total failed
  total=$(wc -l <"$WORK/pooled-secret.log")
  failed=$(grep -vc '^200 ' "$WORK/pooled-secret.log" || true)
  echo "    $total requests during the rotation, $failed failed"
  grep -v '^200 ' "$WORK/pooled-secret.log" | head -5 || true
  expect_eq "$failed" 0 "failed requests during the rotation"
  expect_eq "$(own_pods pooled-secretive)" 0 "pooled-secretive's pods of its own after the rotation"

  kubectl delete fn pooled-secretive -n "$NS" --wait=false >/dev/null
  # The operator narrows the pool's Role every 15 s: the Secret of a deleted Function goes.
  local deleted=$SECONDS
  forgot_secret() { [[ $(kubectl auth can-i get secret/pool-greeting -n "$NS" --as="$pool_sa" || true) == no ]]; }
  wait_until 40 "the pool's Role to forget the deleted Function's Secret" forgot_secret
  echo "    the pool's Role forgot the Secret $((SECONDS - deleted))s after kubectl delete"
  kubectl delete secret pool-greeting pool-unrelated -n "$NS" >/dev/null
  kubectl delete configmap pool-settings -n "$NS" >/dev/null
  ok
}
