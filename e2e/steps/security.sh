# The operator's least privilege: its RBAC, the admission policy that confines its writes,
# and the namespaced install.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

OPERATOR_ACCOUNT=system:serviceaccount:wasmless-system:wasmless-operator

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
  expect_contains "$refused" "function pods run as the default ServiceAccount without its token" "function pods as another account, as the operator"
  refused=$(probe_deployment default true | dry_run_as_operator)
  expect_contains "$refused" "function pods run as the default ServiceAccount without its token" "function pods with a token, as the operator"
  expect_contains "$(probe_deployment default false | dry_run_as_operator)" "created (server dry run)" "function pods as the default account without a token, as the operator"
  refused=$(probe_deployment hello-chunk-reader true | dry_run_as_operator)
  expect_contains "$refused" "or as their Function's chunk reader" "function pods as another Function's chunk reader, as the operator"
  expect_contains "$(probe_deployment probe-chunk-reader true | dry_run_as_operator)" "created (server dry run)" "function pods as their Function's chunk reader, as the operator"
  refused=$(printf '%s\n' 'apiVersion: rbac.authorization.k8s.io/v1' 'kind: Role' \
    'metadata: {name: probe-chunk-reader, labels: {wasmless.io/function: probe}}' \
    'rules: [{apiGroups: [""], resources: [configmaps], verbs: [get], resourceNames: [hello-module-0123456789-0]}]' | dry_run_as_operator)
  expect_contains "$refused" "a chunk reader's Role only get its Function's chunk ConfigMaps" "a chunk reader Role naming another Function's chunks, as the operator"
  # hello's own chunk reader (its revisions are in ConfigMaps): its chunks, by name, and nothing else.
  local reader=system:serviceaccount:$NS:hello-chunk-reader chunk
  chunk=$(kubectl get role hello-chunk-reader -n "$NS" -o 'jsonpath={.rules[0].resourceNames[0]}')
  expect_contains "$chunk" "hello-" "the chunk reader Role names hello's chunks"
  expect_eq "$(kubectl auth can-i get "configmaps/$chunk" --as="$reader" -n "$NS")" yes "hello's chunk reader gets its chunk"
  expect_eq "$(kubectl auth can-i list configmaps --as="$reader" -n "$NS" || true)" no "hello's chunk reader lists no ConfigMaps"
  expect_eq "$(kubectl auth can-i get configmaps/hello-source --as="$reader" -n "$NS" || true)" no "hello's chunk reader gets no other ConfigMap"
  expect_eq "$(kubectl get deploy hello -n "$NS" -o 'jsonpath={.spec.template.spec.serviceAccountName}')" hello-chunk-reader \
    "hello's pods run as its chunk reader"
  # The operator's own writes pass it: the builder RBAC it wrote for hello is there.
  expect_eq "$(kubectl get role wasmless-builder -n "$NS" -o 'jsonpath={.rules[0].verbs}')" '["create","patch"]' \
    "the builder Role's verbs"
  # The namespace's pool (made by scale_to_zero): it reads ConfigMaps, and nothing else.
  local pool=system:serviceaccount:$NS:wasmless-pool
  expect_eq "$(kubectl auth can-i watch configmaps --as="$pool" -n "$NS")" yes "the pool watches ConfigMaps"
  expect_eq "$(kubectl auth can-i get secrets --as="$pool" -n "$NS" || true)" no "the pool reads no Secret"
  expect_eq "$(kubectl auth can-i patch configmaps --as="$pool" -n "$NS" || true)" no "the pool writes no ConfigMap"
  expect_eq "$(kubectl auth can-i list configmaps --as="$pool" -n kube-system || true)" no "the pool reads no other namespace"
  refused=$(printf '%s\n' 'apiVersion: rbac.authorization.k8s.io/v1' 'kind: Role' 'metadata: {name: wasmless-pool}' \
    'rules: [{apiGroups: [""], resources: [configmaps], verbs: [get, create]}]' | dry_run_as_operator)
  expect_contains "$refused" "the wasmless-pool Role only read them" "a pool Role that writes, as the operator"
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

# The doors of docs/security.md, tried from outside as an attacker with fewer rights would:
# each check fails on a release where the door is open.
tenant_doors() {
  step "docs/security.md's doors, tried as an attacker: a ConfigMap editor cannot rewrite or forge what the pool trusts, the compiler has no token, a Service the Function does not own is left alone"
  local editor=system:serviceaccount:$NS:config-editor refused manifest
  kubectl create serviceaccount config-editor -n "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl create role config-editor -n "$NS" --verb=get,list,watch,create,update,patch,delete \
    --resource=configmaps,pods --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl create rolebinding config-editor -n "$NS" --role=config-editor --serviceaccount="$NS:config-editor" \
    --dry-run=client -o yaml | kubectl apply -f - >/dev/null

  # Door 1: two pooled Functions; the attacker wants victim's port to serve thief's code.
  for name in victim thief; do
    manifest=$(python3 -c 'import json,sys; print(json.dumps({
      "apiVersion": "wasmless.io/v1alpha1", "kind": "Function",
      "metadata": {"name": sys.argv[2], "namespace": sys.argv[3]},
      "spec": {"function": sys.argv[1], "scale": {"min": 0, "max": 1}}}))' "$(go_handler "body of $name")" "$name" "$NS")
    kubectl apply -f - <<<"$manifest" >/dev/null
  done
  wait_until 240 "victim and thief to be Ready in the pool" \
    bash -c "[[ \$(kubectl get fn victim thief -n $NS -o 'jsonpath={.items[*].status.phase}') == 'Ready Ready' ]]"
  expect_service_answer victim "body of victim"
  local victim_port entry
  victim_port=$(kubectl get cm victim-pool -n "$NS" -o 'jsonpath={.data.entry\.json}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["port"])')
  entry=$(kubectl get cm thief-pool -n "$NS" -o 'jsonpath={.data.entry\.json}' |
    python3 -c 'import json,sys; e=json.load(sys.stdin); e["port"]=int(sys.argv[1]); print(json.dumps(e))' "$victim_port")
  refused=$(kubectl patch cm victim-pool -n "$NS" --as="$editor" --type merge \
    -p "$(python3 -c 'import json,sys; print(json.dumps({"data": {"entry.json": sys.argv[1]}}))' "$entry")" 2>&1 || true)
  expect_contains "$refused" "only the Wasmless operator writes or deletes it" "the editor rewriting victim-pool"
  refused=$(kubectl create cm a-pool -n "$NS" --as="$editor" --from-literal="entry.json=$entry" --dry-run=client -o yaml |
    kubectl label --local -f - wasmless.io/component=pool-entry wasmless.io/function=victim -o yaml |
    kubectl create -f - --as="$editor" 2>&1 || true)
  expect_contains "$refused" "only the Wasmless operator writes or deletes it" "the editor forging a-pool"
  kubectl create cm innocent -n "$NS" --as="$editor" --from-literal="entry.json=$entry" >/dev/null
  refused=$(kubectl label cm innocent -n "$NS" --as="$editor" wasmless.io/component=pool-entry 2>&1 || true)
  expect_contains "$refused" "only the Wasmless operator writes or deletes it" "the editor labelling a ConfigMap as an entry"
  refused=$(kubectl delete cm victim-pool -n "$NS" --as="$editor" 2>&1 || true)
  expect_contains "$refused" "only the Wasmless operator writes or deletes it" "the editor deleting victim-pool"
  refused=$(kubectl create cm victim-module-0123456789-0 -n "$NS" --from-literal=module.wasm.zst=x --dry-run=client -o yaml |
    kubectl label --local -f - wasmless.io/function=victim wasmless.io/source-digest=0123456789 wasmless.io/module-digest=0123456789 -o yaml |
    kubectl create -f - --as="$editor" 2>&1 || true)
  expect_contains "$refused" "only the Wasmless operator writes or deletes it" "the editor planting a chunk"
  local pod
  pod=$(kubectl get pods -n "$NS" -l wasmless.io/function=hello,wasmless.io/component=runtime -o 'jsonpath={.items[0].metadata.name}')
  refused=$(kubectl annotate pod "$pod" -n "$NS" --as="$editor" --overwrite 'wasmless.io/routes=[]' 2>&1 || true)
  expect_contains "$refused" "only the Wasmless operator changes it" "the editor rewriting a pod's routes"
  # What every pod of hello started from now on serves: a generation above any pod's own.
  refused=$(kubectl patch cm hello-routes -n "$NS" --as="$editor" --type merge \
    -p '{"data": {"traffic.json": "{\"generation\": 999999, \"routes\": []}"}}' 2>&1 || true)
  expect_contains "$refused" "only the Wasmless operator writes or deletes it" "the editor rewriting hello's routes ConfigMap"
  kubectl delete cm innocent -n "$NS" >/dev/null
  sleep 2
  expect_service_answer victim "body of victim"

  # Door 2: the compiler reads no token; the build says why it failed and holds no token.
  manifest=$(python3 -c 'import json,sys; print(json.dumps({
    "apiVersion": "wasmless.io/v1alpha1", "kind": "Function",
    "metadata": {"name": "token-thief", "namespace": sys.argv[1]},
    "spec": {"language": "rust", "source": "use wasmless_sdk::{Request, Response};\n\nconst TOKEN: &[u8] = include_bytes!(\"/var/run/secrets/kubernetes.io/serviceaccount/token\");\n\npub fn handler(_request: Request) -> Response {\n    Response::new(TOKEN.to_vec())\n}\n"}}))' "$NS")
  kubectl apply -f - <<<"$manifest" >/dev/null
  wait_until 600 "token-thief's build to end" bash -c "[[ \$(kubectl get fn token-thief -n $NS -o 'jsonpath={.status.phase}') =~ Failed|Ready ]]"
  local message
  message=$(fn_field token-thief .status.buildMessage)
  echo "    token-thief: $(fn_field token-thief .status.phase): ${message:0:160}"
  expect_eq "$(fn_field token-thief .status.phase)" Failed "token-thief's phase"
  expect_contains "$message" "serviceaccount/token" "token-thief's buildMessage names the file it could not read"
  [[ $message != *eyJ* ]] || fail "token-thief's buildMessage holds a token"
  kubectl delete fn token-thief -n "$NS" --wait=false >/dev/null

  # Door 3: a Service someone else made is never taken over, nor collected.
  kubectl create service clusterip payments -n "$NS" --tcp=80:8443 >/dev/null
  manifest=$(python3 -c 'import json,sys; print(json.dumps({
    "apiVersion": "wasmless.io/v1alpha1", "kind": "Function",
    "metadata": {"name": "squatter", "namespace": sys.argv[2]},
    "spec": {"function": sys.argv[1], "service": "payments"}}))' "$(go_handler squatting)" "$NS")
  kubectl apply -f - <<<"$manifest" >/dev/null
  not_owner() { [[ $(kubectl get fn squatter -n "$NS" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].reason}') == NotOwner ]]; }
  wait_until 120 "squatter's Ready condition to say NotOwner" not_owner
  echo "    squatter: $(kubectl get fn squatter -n "$NS" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].message}' | cut -c1-160)"
  expect_eq "$(kubectl get svc payments -n "$NS" -o 'jsonpath={.spec.selector}')" '{"app":"payments"}' "payments' selector"
  expect_eq "$(kubectl get svc payments -n "$NS" -o 'jsonpath={.metadata.ownerReferences}')" "" "payments' owners"
  kubectl delete fn squatter victim thief -n "$NS" --wait=true >/dev/null
  sleep 3
  expect_eq "$(kubectl get svc payments -n "$NS" -o name 2>&1)" "service/payments" "payments after the Function is deleted"
  kubectl delete svc payments -n "$NS" >/dev/null
  ok
}

# heavy_handler MIB SECONDS: a Goless handler whose every request holds MIB MiB of its
# linear memory for SECONDS seconds, then answers "held".
heavy_handler() {
  printf 'package handlers\n\nimport (\n\t"fmt"\n\t"net/http"\n\t"time"\n)\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {\n\theld := make([]byte, %d<<20)\n\tfor i := range held {\n\t\theld[i] = 1\n\t}\n\ttime.Sleep(%d * time.Second)\n\tfmt.Fprintf(w, "held %%d", held[len(held)-1])\n}\n' "$1" "$2"
}

# Door 5: a pooled Function whose requests each hold ~240 MiB, 16 at once for 40 s, beside
# a neighbour called in a loop: the pool does not restart, the neighbour sees only 200s,
# the heavy one answers or says 503, and drops no connection.
heavy_neighbour() {
  step "a heavy neighbour in the pool: 16 requests at once holding ~240 MiB each for 40 s; the pool stays up, the neighbour sees only 200s, the heavy one 200s and 503s, no dropped connection"
  local manifest name
  for name in heavy light; do
    manifest=$(python3 -c 'import json,sys; print(json.dumps({
      "apiVersion": "wasmless.io/v1alpha1", "kind": "Function",
      "metadata": {"name": sys.argv[2], "namespace": sys.argv[3]},
      "spec": {"function": sys.argv[1], "scale": {"min": 0, "max": 1},
               "limits": {"memory": "256Mi", "timeout": "60s"} if sys.argv[2] == "heavy" else {}}}))' \
      "$([[ $name == heavy ]] && heavy_handler 224 40 || go_handler "light answers")" "$name" "$NS")
    kubectl apply -f - <<<"$manifest" >/dev/null
  done
  wait_until 300 "heavy and light to be Ready in the pool" \
    bash -c "[[ \$(kubectl get fn heavy light -n $NS -o 'jsonpath={.items[*].status.phase}') == 'Ready Ready' ]]"
  expect_eq "$(fn_field heavy .status.servedBy)" pool "heavy's status.servedBy"
  expect_service_answer light "light answers"
  local restarts_before heavy_url light_url i
  restarts_before=$(kubectl get pods -n "$NS" -l wasmless.io/component=pool -o 'jsonpath={range .items[*]}{.metadata.name}={.status.containerStatuses[0].restartCount} {end}')
  heavy_url=$(service_url heavy)
  light_url=$(service_url light)
  # A heavy request holds 40 s: the first ones are the 16 below. A run once sent them
  # before kube-proxy had programmed heavy's ClusterIP, and one failed to connect.
  wait_for_connections "$heavy_url" "heavy's ClusterIP"
  start_request_loop "$light_url" "$WORK/light-loop.log"
  for i in $(seq 16); do
    curl -sS -o /dev/null --max-time 90 -w '%{http_code}\n' "$heavy_url" >"$WORK/heavy-$i.log" 2>&1 &
    PIDS+=($!)
  done
  local started=$SECONDS
  wait_until 120 "the 16 heavy requests to end" bash -c "(( \$(cat $WORK/heavy-*.log | grep -c .) >= 16 ))"
  echo "    the heavy requests ended $((SECONDS - started))s after they were sent"
  stop_request_loop "$WORK/light-loop.log"
  local codes answered refused
  codes=$(cat "$WORK"/heavy-*.log | sort | uniq -c | tr -s ' ' | tr '\n' ';')
  echo "    heavy: $codes"
  answered=$(cat "$WORK"/heavy-*.log | grep -c '^200$' || true)
  refused=$(cat "$WORK"/heavy-*.log | grep -c '^503$' || true)
  expect_eq "$((answered + refused))" 16 "heavy's answers that are 200 or 503 ($codes)"
  ((answered >= 1)) || fail "no heavy request was answered: $codes"
  read -r total failed _ < <(request_loop_figures "$WORK/light-loop.log" 0 "light answers")
  echo "    light, called in a loop meanwhile: $total requests, $failed failed"
  ((total > 100)) || fail "the light loop made only $total requests"
  expect_eq "$failed" 0 "light's failed requests"
  expect_eq "$(kubectl get pods -n "$NS" -l wasmless.io/component=pool -o 'jsonpath={range .items[*]}{.metadata.name}={.status.containerStatuses[0].restartCount} {end}')" \
    "$restarts_before" "the pool pods and their restarts"
  local refusals
  refusals=$(for ip in $(pool_ips); do curl -fsS --max-time 2 "http://$ip:9090/metrics"; done |
    awk '/^wasmless_refused_total\{/ && /function="heavy"/ && /reason="pool_memory"/ { sum += $NF } END { print sum + 0 }')
  echo "    the pool's refusals of heavy for memory: $refusals"
  expect_eq "$refusals" "$refused" "wasmless_refused_total{function=\"heavy\",reason=\"pool_memory\"}"
  kubectl delete fn heavy light -n "$NS" --wait=false >/dev/null
  ok
}

# Door 4 on the cluster: a client keeping its connection to a pooled Function's port on a
# pool pod; the Function deleted; the same connection never answers again (the pool closed
# it), so it can reach no Function given that port later.
keepalive_to_deleted() {
  step "a keep-alive connection to a pooled Function that is deleted reaches nobody after, not even the Function given its port next"
  local manifest ip port taker
  manifest=$(python3 -c 'import json,sys; print(json.dumps({
    "apiVersion": "wasmless.io/v1alpha1", "kind": "Function",
    "metadata": {"name": "leaving", "namespace": sys.argv[2]},
    "spec": {"function": sys.argv[1], "scale": {"min": 0, "max": 1}}}))' "$(go_handler "leaving answers")" "$NS")
  kubectl apply -f - <<<"$manifest" >/dev/null
  wait_until 240 "leaving to be Ready in the pool" bash -c "[[ \$(kubectl get fn leaving -n $NS -o 'jsonpath={.status.phase}/{.status.servedBy}') == Ready/pool ]]"
  wait_until 30 "every pool pod to list leaving" pool_lists leaving
  port=$(kubectl get cm leaving-pool -n "$NS" -o 'jsonpath={.data.entry\.json}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["port"])')
  # Not `pool_ips | head -1`: head leaving early can kill kubectl with SIGPIPE, and
  # under pipefail that fails the step (stop 55's CI, exit 141).
  read -r ip < <(pool_ips)
  # The operator gives a pooled Function the port its name hashes to (objects/pool.rs
  # free_pool_port: sha256 of the name, 20000 + the first 16 bits mod 12000) when free: a
  # name that lands on leaving's port is the Function an attacker would create next.
  taker=$(python3 -c 'import hashlib,itertools,sys
port = int(sys.argv[1])
for i in itertools.count():
    name = f"taker-{i}"
    if 20000 + int(hashlib.sha256(name.encode()).hexdigest()[:4], 16) % 12000 == port:
        print(name); break' "$port")
  python3 - "$ip" "$port" "$NS" "$taker" "$(go_handler "taker answers")" <<'PY' || fail "the connection kept to a deleted Function reached the next one on its port"
import json, socket, subprocess, sys, time
ip, port, ns, taker, source = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]

def ask(sock):
    """One GET on the socket as it is (a closed one is not reopened): the raw bytes back."""
    sock.sendall(b"GET / HTTP/1.1\r\nHost: e2e\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        if not piece:
            return data
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        piece = sock.recv(65536)
        if not piece:
            break
        body += piece
    return head + b"\r\n\r\n" + body

def kubectl(*args, stdin=None):
    return subprocess.run(["kubectl", *args], input=stdin, check=True, capture_output=True, text=True).stdout

def wait(what, check, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.5)
    sys.exit(f"{what}: not within {seconds} s")

def pool_lists(name):
    return f'"{name}"' in subprocess.run(["curl", "-fsS", "--max-time", "2", f"http://{ip}:9090/pool"], capture_output=True, text=True).stdout

def new_connection_answers(body):
    try:
        with socket.create_connection((ip, port), timeout=5) as fresh:
            return ask(fresh).endswith(body.encode())
    except OSError:
        return False

kept = socket.create_connection((ip, port), timeout=10)
first = ask(kept)
assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"leaving answers"), first
print(f"    {ip}:{port} answered 'leaving answers' on a kept connection")
kubectl("delete", "fn", "leaving", "-n", ns, "--wait=false")
wait("the pool to stop listing leaving", lambda: not pool_lists("leaving"), 60)
kubectl("apply", "-f", "-", stdin=json.dumps({
    "apiVersion": "wasmless.io/v1alpha1", "kind": "Function",
    "metadata": {"name": taker, "namespace": ns},
    "spec": {"function": source, "scale": {"min": 0, "max": 1}}}))
started = time.time()
wait(f"{taker} to be Ready in the pool", lambda: kubectl("get", "fn", taker, "-n", ns, "-o", "jsonpath={.status.phase}/{.status.servedBy}") == "Ready/pool", 240)
entry = json.loads(kubectl("get", "cm", f"{taker}-pool", "-n", ns, "-o", "jsonpath={.data.entry\\.json}"))
assert entry["port"] == port, f"{taker} was given port {entry['port']}, not leaving's {port}"
wait(f"{taker} to answer on leaving's port {port}", lambda: new_connection_answers("taker answers"), 90)
print(f"    {taker}, given leaving's port {port}, answers a new connection there {time.time() - started:.0f} s after its apply")
try:
    after = ask(kept)
except OSError as error:
    print(f"    the kept connection is closed: {type(error).__name__}")
else:
    assert b"taker answers" not in after, f"the kept connection reached {taker}: {after!r}"
    status = after.split(b"\r\n")[0].decode() if after else "the end of the stream"
    print(f"    the kept connection gets {status}: it reaches nobody")
kubectl("delete", "fn", taker, "-n", ns, "--wait=false")
PY
  ok
}
