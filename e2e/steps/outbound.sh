# Real functions: one Function calling another through its Service by name, a call the
# allow-list does not name refused, and a value from a Secret that follows the Secret.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

# caller_handler: GET ?url=U calls U with plain net/http and answers what came back.
caller_handler() {
  cat <<'GO'
package handlers

import (
	"fmt"
	"io"
	"net/http"
	"time"
)

func Handler(w http.ResponseWriter, r *http.Request) {
	client := &http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get(r.URL.Query().Get("url"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Fprintf(w, "%d %s", resp.StatusCode, body)
}
GO
}

# runtime_metrics FUNCTION: the /metrics of one of its pods, read on the pod's own address.
runtime_metrics() {
  local ip
  # A pod being deleted (the rollout's old one) is no longer sent requests: read a live one.
  ip=$(kubectl get pods -n "$NS" -l "wasmless.io/function=$1,wasmless.io/component=runtime" \
    -o 'jsonpath={range .items[?(@.status.podIP)]}{.metadata.deletionTimestamp}{" "}{.status.podIP}{"\n"}{end}' |
    awk 'NF == 1 {print $1; exit}')
  curl -fsS --max-time 5 "http://$ip:9090/metrics"
}

call_another_function() {
  step "Function caller calls Function callee by its Service name with http.Get; a host not listed is refused and counted"
  new_function callee "from callee"
  local source
  source=$(caller_handler | sed 's/^/    /')
  printf 'apiVersion: wasmless.io/v1alpha1\nkind: Function\nmetadata: {name: caller}\nspec:\n  outbound:\n    allow: ["http://callee:8080", "http://callee.%s.svc.cluster.local:8080"]\n  source: |\n%s\n' \
    "$NS" "$source" | kubectl apply -n "$NS" -f - >/dev/null
  kubectl wait fn/callee fn/caller -n "$NS" --for=condition=Ready --timeout=600s >/dev/null
  # The calls below and the metrics read after them must be the same pod's.
  built_and_rolled caller
  local caller
  caller=$(service_url caller)
  expect_service_answer callee "from callee"
  # Ready is the pods'; kube-proxy programs caller's new Service a moment later.
  wait_until 30 "caller's Service to answer" get "${caller}?url=http://callee:8080/"
  local answer
  answer=$(get "${caller}?url=http://callee:8080/")
  expect_eq "$answer" "200 from callee" "caller's call to http://callee:8080 (the short name, resolved by the cluster's DNS)"
  answer=$(get "${caller}?url=http://callee.$NS.svc.cluster.local:8080/")
  expect_eq "$answer" "200 from callee" "caller's call to callee's full name"
  expect_contains "$(fn_field caller .status.url)" "caller.$NS.svc.cluster.local" "status.url"
  local refused
  refused=$(curl -sS --max-time 5 "${caller}?url=http://example.com/" || true)
  echo "refused: $refused"
  expect_contains "$refused" "spec.outbound.allow" "the error of a call to a host not listed"
  local metrics
  metrics=$(runtime_metrics caller)
  expect_contains "$metrics" "wasmless_outbound_requests_total{function=\"caller\",host=\"callee.$NS.svc.cluster.local\",status=\"200\"} 1" "the call to the full name, counted"
  expect_contains "$metrics" 'wasmless_outbound_requests_total{function="caller",host="callee",status="200"}' "the calls to the short name, counted"
  expect_contains "$metrics" 'wasmless_outbound_requests_total{function="caller",host="example.com",status="denied"} 1' "the refused call counted"
  kubectl delete fn caller callee -n "$NS" --wait=false >/dev/null
  ok
}

secret_rotation() {
  step "a value from a Secret through env valueFrom; after kubectl patch of the Secret the answer changes within 30 s, no request failing"
  kubectl create secret generic greeting -n "$NS" --from-literal=text=first >/dev/null
  local source
  source=$(printf 'package handlers\n\nimport (\n\t"net/http"\n\t"os"\n)\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {\n\tw.Write([]byte(os.Getenv("GREETING")))\n}\n' | sed 's/^/    /')
  printf 'apiVersion: wasmless.io/v1alpha1\nkind: Function\nmetadata: {name: secretive}\nspec:\n  env:\n    - name: GREETING\n      valueFrom: {secretKeyRef: {name: greeting, key: text}}\n  source: |\n%s\n' \
    "$source" | kubectl apply -n "$NS" -f - >/dev/null
  kubectl wait fn/secretive -n "$NS" --for=condition=Ready --timeout=600s >/dev/null
  expect_service_answer secretive "first"
  local spec
  spec=$(kubectl get fn/secretive deploy/secretive -n "$NS" -o yaml; kubectl get cm,jobs -n "$NS" -l wasmless.io/function=secretive -o yaml)
  [[ $spec != *first* ]] || fail "the Secret's value appears in the Function, its Deployment or its source ConfigMap"
  local url
  url=$(service_url secretive)
  # A stop file of its own: rolling_update's loop, later, stops on $WORK/stop.
  (
    while [[ ! -f $WORK/stop-rotation ]]; do
      if body=$(get "$url" 2>&1); then echo "ok $body"; else echo "FAIL $body"; fi
      sleep 0.05
    done
  ) >"$WORK/secret-requests.log" &
  PIDS+=($!)
  local loop=$!
  sleep 1
  local patched=$SECONDS
  kubectl patch secret greeting -n "$NS" --type merge -p '{"stringData":{"text":"second"}}' >/dev/null
  answers_second() { [[ $(tail -1 "$WORK/secret-requests.log") == "ok second" ]]; }
  wait_until 30 "the new value" answers_second
  echo "the new value answered $((SECONDS - patched)) s after the patch"
  sleep 2
  touch "$WORK/stop-rotation"
  wait "$loop" || true
  local total failed
  total=$(wc -l <"$WORK/secret-requests.log")
  failed=$(grep -c '^FAIL' "$WORK/secret-requests.log" || true)
  echo "$total requests during the rotation, $failed failed"
  grep '^FAIL' "$WORK/secret-requests.log" | head -5 || true
  expect_eq "$failed" 0 "failed requests during the rotation"
  kubectl delete fn secretive -n "$NS" --wait=false >/dev/null
  kubectl delete secret greeting -n "$NS" >/dev/null
  ok
}
