# Functions run on events (issue 42, docs/architecture.md "Events"): deploy/events/ as
# shipped, the broker on a PersistentVolume the test makes as an admin would; the example
# examples/orders-go, at zero in the pool, gets what a ServiceAccount of its namespace
# publishes through the ingress; an event its handler keeps refusing (503) is parked as a
# dead letter after its tries, one it calls bad (400) at once; and
# docs/security.md's door 8, tried from outside: another namespace's token, no token, a
# token for the API server, the broker itself, the component's own Secret rights.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

# The events steps' own namespace, so that its pool is theirs alone (its logs are read).
EVENTS_NS=e2e-events
EVENTS_OTHER_NS=e2e-events-other

# install_events: the volume the broker's claim binds (no StorageClass on the test cluster),
# then deploy/events/ as shipped.
install_events() {
  local data=$WASMLESS_CLUSTER_DIR/events-broker
  mkdir -p "$data"
  chown 65532:65532 "$data"
  chmod 0700 "$data"
  kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolume
metadata:
  name: wasmless-e2e-events-broker
spec:
  capacity:
    storage: 10Gi
  accessModes: ["ReadWriteOnce"]
  persistentVolumeReclaimPolicy: Retain
  hostPath:
    path: $data
    type: Directory
EOF
  kubectl apply -k deploy/events/ >/dev/null
  kubectl rollout status -n wasmless-system deploy/wasmless-events --timeout=180s >/dev/null ||
    fail "wasmless-events did not become ready"
  kubectl rollout status -n wasmless-system statefulset/wasmless-nats --timeout=180s >/dev/null ||
    fail "the broker (wasmless-nats) did not become ready"
}

events_url() {
  kubectl get svc wasmless-events -n wasmless-system -o 'jsonpath=http://{.spec.clusterIP}:{.spec.ports[0].port}'
}

# publish NAMESPACE SUBJECT BODY [TOKEN] [ID]: the ingress's status code; its answer in
# $WORK/published.
publish() {
  local args=(-sS --max-time 10 -o "$WORK/published" -w '%{http_code}' -X POST -H 'content-type: text/plain' --data-binary "$3")
  [[ -n ${4:-} ]] && args+=(-H "authorization: Bearer $4")
  [[ -n ${5:-} ]] && args+=(-H "ce-id: $5")
  curl "${args[@]}" "$(events_url)/publish/$1/$2" || true
}

# delivered FUNCTION OUTCOME: wasmless_events_delivered_total of FUNCTION in $NS with that
# outcome, summed over the component's replicas.
delivered() {
  local ip sum=0 value
  for ip in $(kubectl get pods -n wasmless-system -l app.kubernetes.io/name=wasmless-events \
    -o 'jsonpath={.items[?(@.status.phase=="Running")].status.podIP}'); do
    value=$({ curl -fsS --max-time 2 "http://$ip:9090/metrics" || true; } |
      awk -v fn="function=\"$1\"" -v ns="function_namespace=\"$NS\"" -v outcome="outcome=\"$2\"" \
        '/^wasmless_events_delivered_total\{/ && index($0, fn) && index($0, ns) && index($0, outcome) { sum += $NF } END { print sum + 0 }')
    sum=$((sum + ${value%.*}))
  done
  echo "$sum"
}

events_delivered() {
  step "events (deploy/events/): what a ServiceAccount publishes through the ingress reaches its namespace's pooled Function once each, one the handler keeps refusing is parked as a dead letter after its tries, and no other namespace, no token and no one at the broker gets in"
  install_events
  local NS=$EVENTS_NS # the helpers read NS
  kubectl create namespace "$NS" >/dev/null 2>&1 || true
  local token other_token status i fn=orders-go
  kubectl apply -n "$NS" -f examples/orders-go/function.yaml >/dev/null
  wait_until 240 "$fn to be Ready in the pool" phase_is "$fn" Ready

  token=$(kubectl create token default -n "$NS" --audience wasmless-events --duration 1h)
  # (1) 20 events: each accepted, each handled once (no fault, so no duplicate either).
  # The component makes the namespace's stream when it sees the trigger: until then a
  # publish is told no Function there has a queue trigger (404).
  stream_made() { [[ $(publish "$NS" orders.created '{"id": "order-1", "quantity": 1}' "$token" order-1) == 202 ]]; }
  wait_until 60 "the ingress to take $NS's first event" stream_made
  for i in $(seq 2 20); do
    status=$(publish "$NS" orders.created "{\"id\": \"order-$i\", \"quantity\": $i}" "$token" "order-$i")
    expect_eq "$status" 202 "publishing order-$i ($(cat "$WORK/published"))"
  done
  expect_contains "$(cat "$WORK/published")" '"id":"order-20"' "the ingress's answer"
  all_handled() { (($(delivered "$fn" ok) >= 20)); }
  wait_until 60 "the 20 events to be handled by $fn (in the pool)" all_handled
  expect_eq "$(fn_field "$fn" .status.servedBy)" pool "$fn's status.servedBy while it handled them"
  # The same id again within the broker's window: accepted, and not handled again.
  expect_eq "$(publish "$NS" orders.created '{"id": "order-20", "quantity": 20}' "$token" order-20)" 202 "publishing order-20 again"

  # (2) Out of stock every time (503): 4 tries (retries: 3, after 1, 2, 4 s), then parked;
  # not an order (400): parked at once.
  expect_eq "$(publish "$NS" orders.created '{"id": "order-big", "quantity": 1000}' "$token" order-big)" 202 "publishing order-big"
  expect_eq "$(publish "$NS" orders.created 'not json' "$token" garbage)" 202 "publishing garbage"
  parked() { (($(delivered "$fn" dead_letter) >= 2)); }
  wait_until 60 "order-big and garbage to be parked as dead letters" parked
  expect_eq "$(delivered "$fn" retry)" 3 "tries that were retried (order-big's first three)"
  expect_eq "$(delivered "$fn" dead_letter)" 2 "events parked"
  expect_eq "$(delivered "$fn" ok)" 20 "events handled, after order-20 was published again"
  echo "    20 events handled once each from the pool, order-big parked after 4 tries, garbage at once"
  # What `kubectl get fn` says of it, as wasmless-events writes it from the broker.
  two_parked() { [[ $(fn_field "$fn" .status.triggersSummary) == *"lag 0 dead 2" ]]; }
  wait_until 30 "$fn's status to show its trigger drained and its 2 dead letters" two_parked
  kubectl get fn "$fn" -n "$NS" | sed 's/^/    /'
  # And `wasmless events`: the trigger's row, then the tries that failed and the parked.
  local wasmless=${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}/release/wasmless said
  noted() {
    said=$("$wasmless" events "$fn" -n "$NS" 2>&1) &&
      (($(grep -c 'EventRetrying .*order-big' <<<"$said") == 3)) &&
      grep -q 'EventDeadLettered .*order-big .*after try 4' <<<"$said" &&
      grep -q 'EventDeadLettered .*garbage .*after try 1' <<<"$said"
  }
  wait_until 30 "wasmless events to show order-big's 3 failed tries and both dead letters" noted
  expect_eq "$(awk '$1 == "created" { print $2, $3, $4, $5 }' <<<"$said")" "queue orders.created 0 2" "wasmless events' row of the trigger"
  sed 's/^/    /' <<<"$said"

  # (3) Door 8, from outside.
  kubectl create namespace "$EVENTS_OTHER_NS" >/dev/null 2>&1 || true
  kubectl create serviceaccount default -n "$EVENTS_OTHER_NS" >/dev/null 2>&1 || true
  wait_until 30 "$EVENTS_OTHER_NS's default ServiceAccount" kubectl get sa default -n "$EVENTS_OTHER_NS"
  other_token=$(kubectl create token default -n "$EVENTS_OTHER_NS" --audience wasmless-events --duration 1h)
  expect_eq "$(publish "$NS" orders.created '{"id": "elsewhere"}' "$other_token")" 403 "another namespace's token publishing into $NS"
  expect_contains "$(cat "$WORK/published")" "publishes into namespace $EVENTS_OTHER_NS only" "the refusal"
  expect_eq "$(publish "$EVENTS_OTHER_NS" orders.created "to elsewhere" "$token")" 403 "$NS's token publishing into $EVENTS_OTHER_NS"
  expect_eq "$(publish "$NS" orders.created "no token")" 401 "a publish with no token"
  expect_contains "$(cat "$WORK/published")" "--audience wasmless-events" "the answer to a publish with no token"
  expect_eq "$(publish "$NS" orders.created "api token" "$(kubectl create token default -n "$NS" --duration 1h)")" 401 \
    "a token of $NS made for the API server, not for wasmless-events"
  expect_eq "$(publish "$NS" _deadletter.orders.created "forged" "$token")" 400 "a publish to Wasmless's own subjects"
  sleep 2
  expect_eq "$(delivered "$fn" ok)" 20 "events handled after the refused publishes"

  # The broker takes no connection without the component's password: a client at its pod.
  local broker_ip said
  broker_ip=$(kubectl get pod wasmless-nats-0 -n wasmless-system -o 'jsonpath={.status.podIP}')
  said=$(python3 - "$broker_ip" <<'EOF'
import socket, sys, time
s = socket.create_connection((sys.argv[1], 4222), timeout=5)
s.recv(4096)  # INFO
s.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nSUB wasmless.> 1\r\nPING\r\n')
time.sleep(1)
print(s.recv(4096).decode(errors="replace").strip())
EOF
)
  expect_contains "$said" "Authorization Violation" "a client connecting to the broker with no password"
  # RBAC lets the component create Secrets in its namespace; the admission policy, only its own.
  local as_events=(--as system:serviceaccount:wasmless-system:wasmless-events)
  said=$(kubectl create secret generic not-the-broker -n wasmless-system --from-literal=a=b "${as_events[@]}" 2>&1) &&
    fail "wasmless-events made Secret not-the-broker: $said"
  expect_contains "$said" "wasmless-events makes one Secret" "wasmless-events making another Secret"
  # It may write a Function's status, and the admission policy holds it to the triggers'
  # progress: the rest is the operator's (status.revisions says what a rollback serves).
  # (A PATCH with the component's own token: it may not GET the status, which kubectl
  # patch would first.)
  local events_token server module_ref
  module_ref=$(fn_field "$fn" .status.moduleRef)
  events_token=$(kubectl create token wasmless-events -n wasmless-system --duration 10m)
  server=$(kubectl config view --minify --raw -o 'jsonpath={.clusters[0].cluster.server}')
  kubectl config view --minify --raw -o 'jsonpath={.clusters[0].cluster.certificate-authority-data}' | base64 -d >"$WORK/api-ca.crt"
  said=$(curl -sS --max-time 10 --cacert "$WORK/api-ca.crt" -X PATCH -H "authorization: Bearer $events_token" \
    -H 'content-type: application/merge-patch+json' --data '{"status": {"moduleRef": "oci://attacker.example/evil@sha256:00"}}' \
    "$server/apis/wasmless.io/v1alpha1/namespaces/$NS/functions/$fn/status" 2>&1)
  expect_contains "$said" "writes only status.triggers" "wasmless-events changing $fn's status.moduleRef"
  expect_eq "$(fn_field "$fn" .status.moduleRef)" "$module_ref" "$fn's status.moduleRef after the refused write"
  echo "    refused: another namespace's token (403 both ways), no token and an API server token (401), Wasmless's own subject (400), a client at the broker with no password, another Secret made as the component, a Function's moduleRef written as the component"

  kubectl delete fn "$fn" -n "$NS" --wait=false >/dev/null
  kubectl delete namespace "$EVENTS_OTHER_NS" --wait=false >/dev/null
  ok
}

# A handler that writes "WORD <its event's ce-id>" to stderr (the pool logs it as a handler
# line, with its time) and answers 204: what events_survive_kills and events_on_schedule count.
id_logging_handler() { # WORD
  printf 'package handlers\n\nimport (\n\t"fmt"\n\t"net/http"\n\t"os"\n)\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {\n\tfmt.Fprintf(os.Stderr, "%s %%s\\n", r.Header.Get("ce-id"))\n\tw.WriteHeader(http.StatusNoContent)\n}\n' "$1"
}

events_survive_kills() {
  local count=10000 NS=$EVENTS_NS
  step "events survive their component and their broker: $count events published to a Function at zero while a wasmless-events pod and then the broker's pod are killed, each one handled, the duplicates counted; the backlog scales the Function out of the pool, and it goes back to zero once drained"
  local manifest token ids
  kubectl create namespace "$NS" >/dev/null 2>&1 || true
  manifest=$(python3 -c 'import json,sys; print(json.dumps({
    "apiVersion": "wasmless.io/v1alpha1", "kind": "Function",
    "metadata": {"name": "tally", "namespace": sys.argv[2]},
    "spec": {"function": sys.argv[1], "scale": {"min": 0, "max": 3, "idleTimeout": "15s"},
             "triggers": [{"name": "counted", "queue": {"subject": "tally.in", "maxInFlight": 50}}]}}))' "$(id_logging_handler tally)" "$NS")
  kubectl apply -f - <<<"$manifest" >/dev/null
  wait_until 240 "tally to be Ready in the pool" phase_is tally Ready
  token=$(kubectl create token default -n "$NS" --audience wasmless-events --duration 1h)
  stream_ready() { [[ $(publish "$NS" tally.in warm-up "$token" warm-up) == 202 ]]; }
  wait_until 60 "the ingress to take tally's first event" stream_ready

  # One publisher on a kept-alive connection, each event sent until the ingress has it (a
  # 503 or a broken connection while a pod is down is sent again, under the same ce-id);
  # a third of the way, a wasmless-events pod is deleted; at two thirds, the broker's.
  python3 - "$(events_url)" "$NS" "$token" "$count" <<'EOF' || fail "publishing tally's events"
import http.client, subprocess, sys, time, urllib.parse
url, ns, token, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
host = urllib.parse.urlparse(url).netloc
connection, resent, started = None, 0, time.time()
for i in range(1, count + 1):
    if i == count // 3:
        subprocess.run(["kubectl", "delete", "pod", "-n", "wasmless-system", "-l", "app.kubernetes.io/name=wasmless-events",
                        "--field-selector=status.phase=Running", "--wait=false", "--grace-period=1"], check=True, capture_output=True)
        pods = subprocess.run(["kubectl", "get", "pods", "-n", "wasmless-system", "-l", "app.kubernetes.io/name=wasmless-events", "-o", "name"],
                              capture_output=True, text=True).stdout.split()
        print(f"    at {i}: deleted the wasmless-events pods ({len(pods)} listed)", flush=True)
    if i == 2 * count // 3:
        subprocess.run(["kubectl", "delete", "pod", "-n", "wasmless-system", "wasmless-nats-0", "--wait=false"], check=True, capture_output=True)
        print(f"    at {i}: deleted the broker's pod", flush=True)
    while True:
        try:
            if connection is None:
                connection = http.client.HTTPConnection(host, timeout=10)
            connection.request("POST", f"/publish/{ns}/tally.in", body=f"event {i}",
                               headers={"authorization": f"Bearer {token}", "ce-id": f"t-{i}"})
            response = connection.getresponse()
            response.read()
            if response.status == 202:
                break
            if response.status not in (503, 502):
                sys.exit(f"publishing t-{i}: {response.status}")
        except (OSError, http.client.HTTPException):
            connection = None
        resent += 1
        if time.time() - started > 600:
            sys.exit(f"publishing t-{i}: not accepted within 10 minutes")
        time.sleep(0.2)
print(f"    {count} published in {time.time() - started:.1f} s, {resent} sends again while a pod was down", flush=True)
EOF

  # Every id in the handler lines of the pool (and of tally's own pods, should the
  # autoscaler give it some under the backlog): each handled at least once. What each read
  # finds is kept, so a pod gone since still counts.
  : >"$WORK/tally.all"
  tally_seen() {
    {
      kubectl logs -n "$NS" -l wasmless.io/component=pool --tail=-1 --max-log-requests 10
      kubectl logs -n "$NS" -l wasmless.io/function=tally,wasmless.io/component=runtime --tail=-1 --max-log-requests 10
    } 2>/dev/null | grep -o '"tally t-[0-9]*' | sed 's/^"tally //' >"$WORK/tally.last" || true
    cat "$WORK/tally.last" >>"$WORK/tally.all"
    (($(sort -u "$WORK/tally.all" | wc -l) >= count))
  }
  local deadline=$((SECONDS + 300))
  until tally_seen; do
    ((SECONDS < deadline)) || fail "tally handled $(sort -u "$WORK/tally.all" | wc -l) distinct events of $count within 300 s"
    sleep 3
  done
  ids=$(sort -u "$WORK/tally.all" | wc -l)
  expect_eq "$ids" "$count" "distinct events handled"
  echo "    $count events handled, $(($(wc -l <"$WORK/tally.last") - $(sort -u "$WORK/tally.last" | wc -l))) of them more than once (at least once is the promise, with the same ce-id each time)"

  # The backlog, counted by the autoscaler from status.triggers' lag, gave tally pods of
  # its own; drained, it is back in the pool with none after its 15 s idle timeout.
  local scaled
  scaled=$(kubectl get events -n "$NS" --field-selector involvedObject.name=tally,reason=ScaledUp -o 'jsonpath={.items[*].message}')
  expect_contains "$scaled" "events waiting" "tally's ScaledUp Events"
  echo "    scaled out: $(cut -c1-160 <<<"$scaled")"
  drained() { [[ $(fn_field tally .status.triggersSummary) == "counted lag 0" ]]; }
  wait_until 60 "tally's status to show its trigger drained" drained
  local started=$SECONDS
  back_to_zero() { served_by_is tally pool && (($(own_pods tally) == 0)); }
  wait_until 180 "tally back in the pool with no pod of its own" back_to_zero
  echo "    back to zero pods $((SECONDS - started)) s after the queue was seen drained (idleTimeout 15s)"
  kubectl delete fn tally -n "$NS" --wait=false >/dev/null
  ok
}

events_on_schedule() {
  local NS=$EVENTS_NS seconds=60
  step "a per-second schedule on a Function at zero fires within a second of each tick for $seconds s, exactly once a tick, also across the deletion of a wasmless-events pod (every replica publishes every tick; the broker keeps one per tick)"
  kubectl create namespace "$NS" >/dev/null 2>&1 || true
  local manifest started
  manifest=$(python3 -c 'import json,sys; print(json.dumps({
    "apiVersion": "wasmless.io/v1alpha1", "kind": "Function",
    "metadata": {"name": "ticker", "namespace": sys.argv[2]},
    "spec": {"function": sys.argv[1], "scale": {"min": 0},
             "triggers": [{"name": "every-second", "schedule": "* * * * * *", "path": "/tick"}]}}))' "$(id_logging_handler tick)" "$NS")
  kubectl apply -f - <<<"$manifest" >/dev/null
  wait_until 240 "ticker to be Ready in the pool" phase_is ticker Ready
  # The ticks since the trigger started waited in the broker for the Function to be served,
  # and come first, at once: the window starts once ticks are handled as they come.
  ticking_on_time() {
    kubectl logs -n "$NS" -l wasmless.io/component=pool --tail=200 --max-log-requests 10 2>/dev/null | python3 -c '
import datetime, json, sys, time
for line in sys.stdin:
    try:
        entry = json.loads(line)
    except ValueError:
        continue
    message = entry.get("message", "")
    if message.startswith("tick ") and "@" in message:
        tick = datetime.datetime.fromisoformat(message.split("@", 1)[1].replace("Z", "+00:00")).timestamp()
        at = datetime.datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp()
        if at - tick < 1 and tick > time.time() - 5:
            sys.exit(0)
sys.exit(1)'
  }
  wait_until 60 "ticker's ticks to be handled as they come" ticking_on_time
  started=$(date +%s)
  sleep $((seconds / 2))
  local pod
  pod=$(kubectl get pods -n wasmless-system -l app.kubernetes.io/name=wasmless-events -o 'jsonpath={.items[0].metadata.name}')
  kubectl delete pod "$pod" -n wasmless-system --wait=false --grace-period=1 >/dev/null
  echo "    at $((seconds / 2)) s: deleted $pod, one of the two wasmless-events pods"
  sleep $((seconds / 2 + 3))
  kubectl logs -n "$NS" -l wasmless.io/component=pool --tail=-1 --max-log-requests 10 >"$WORK/ticker.log" 2>/dev/null || true
  # The ticks of the whole window, from 2 s after the first handled one to 2 s before the
  # end: each handled once, within a second of its time (the node's clock for both).
  python3 - "$WORK/ticker.log" "$started" "$seconds" <<'EOF' || fail "the schedule's ticks (above)"
import datetime, json, sys
log, started, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
handled = {}
for line in open(log):
    try:
        entry = json.loads(line)
    except ValueError:
        continue
    message = entry.get("message", "")
    if not message.startswith("tick ") or "@" not in message:
        continue
    tick = datetime.datetime.fromisoformat(message.split("@", 1)[1].replace("Z", "+00:00")).timestamp()
    at = datetime.datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp()
    handled.setdefault(int(tick), []).append(at - tick)
window = range(started + 2, started + seconds - 2)
missing = [t for t in window if t not in handled]
twice = [t for t in window if len(handled.get(t, [])) > 1]
late = [(t, round(max(handled[t]), 3)) for t in window if t in handled and max(handled[t]) > 1.0]
delays = sorted(d for t in window if t in handled for d in handled[t])
print(f"    {len(window)} ticks in the window: {len(window) - len(missing)} handled, {len(twice)} twice, "
      f"tick to handler p50 {delays[len(delays) // 2] * 1000:.0f} ms, max {delays[-1] * 1000:.0f} ms" if delays else "    no tick handled")
if missing or twice or late:
    sys.exit(f"missing {missing}, twice {twice}, later than 1 s {late}")
EOF
  kubectl delete namespace "$NS" --wait=false >/dev/null
  ok
}
