# The operator's trace of an apply on the cluster: an OpenTelemetry Collector on the bridge
# (built from its Go modules, as the runtime's trace test has it), the operator told of it
# with --otlp-endpoint, a new Function applied, its trace read back.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

apply_traced() {
  step "--otlp-endpoint: one trace per apply, with its reconciles, the build Job and the builder's phases"
  local otelcol dir port=14318 endpoint collector output trace
  otelcol=${WASMLESS_OTELCOL:-$(otelcol_tool)}
  dir=$WORK/collector
  endpoint=http://$GATEWAY:$port
  mkdir -p "$dir"
  cat >"$dir/config.yaml" <<EOF
receivers:
  otlp:
    protocols:
      http:
        endpoint: $GATEWAY:$port
exporters:
  file:
    path: $dir/spans.jsonl
    flush_interval: 100ms
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
EOF
  "$otelcol" --config="$dir/config.yaml" >"$dir/log" 2>&1 &
  collector=$!
  PIDS+=("$collector")
  wait_until 30 "the collector listening on $GATEWAY:$port" bash -c "exec 3<>/dev/tcp/$GATEWAY/$port"
  set_operator_otlp "$endpoint"

  kubectl apply -n "$NS" -f - >/dev/null <<EOF
apiVersion: wasmless.io/v1alpha1
kind: Function
metadata:
  name: traced
spec:
  language: go
  source: |
    package handlers

    import "net/http"

    func Handler(w http.ResponseWriter, r *http.Request) { w.Write([]byte("traced $RANDOM$RANDOM")) }
EOF
  kubectl wait fn/traced -n "$NS" --for=condition=Ready --timeout=180s >/dev/null
  wait_until 30 "the apply's whole trace at the collector" python3 e2e/apply_trace.py "$dir/spans.jsonl" traced
  output=$(python3 e2e/apply_trace.py "$dir/spans.jsonl" traced)
  echo "$output"
  trace=$(tail -1 <<<"$output" | cut -d' ' -f2)
  # The picture of it: docs/apply-trace.svg is this, kept by
  # WASMLESS_APPLY_TRACE_PICTURE=docs/apply-trace.svg e2e/run.sh install_operator apply_traced
  local picture=${WASMLESS_APPLY_TRACE_PICTURE:-$WORK/apply-trace.svg}
  python3 e2e/trace_picture.py "$dir/spans.jsonl" --trace "$trace" --fold reconcile --out "$picture" 2>/dev/null
  [[ -z ${WASMLESS_APPLY_TRACE_PICTURE:-} ]] || cp "$dir/spans.jsonl" "${picture%.svg}.jsonl"
  echo "    picture: $picture"

  # Undone as it was done: the operator without a collector (which rolls every function pod
  # back to no endpoint), the Function deleted, the collector stopped.
  kubectl delete fn traced -n "$NS" --wait=true >/dev/null
  set_operator_otlp ""
  kill "$collector" 2>/dev/null || true
  ok
}

# set_operator_otlp ENDPOINT: the operator's WASMLESS_OTLP_ENDPOINT (empty: unset), rolled
# out, and a replica with it holding the Lease.
set_operator_otlp() {
  if [[ -n $1 ]]; then
    kubectl set env deploy/wasmless-operator -n wasmless-system "WASMLESS_OTLP_ENDPOINT=$1" >/dev/null
  else
    kubectl set env deploy/wasmless-operator -n wasmless-system WASMLESS_OTLP_ENDPOINT- >/dev/null
  fi
  kubectl rollout status deploy/wasmless-operator -n wasmless-system --timeout=180s >/dev/null
  wait_until 90 "a replica with WASMLESS_OTLP_ENDPOINT='$1' holding the Lease" leader_has_otlp "$1"
}

leader_has_otlp() {
  local holder
  holder=$(leader) || return 1
  [[ $(kubectl get pod "$holder" -n wasmless-system \
    -o 'jsonpath={.spec.containers[0].env[?(@.name=="WASMLESS_OTLP_ENDPOINT")].value}') == "$1" ]]
}
