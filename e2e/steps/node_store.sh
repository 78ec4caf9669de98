# The node's code store (issue 39, docs/plans/node-code-store.md): the node agent installed
# from deploy/node-agent/ as the CSI driver code.wasmless.io, which the operator's
# --node-code-store auto finds, so runtime pods map a Function's compiled code from the node's one
# verified copy. Tried as a user would notice it, and as an attacker in another namespace.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

STORE_DIR=$WASMLESS_CLUSTER_DIR/code-store
INTRUDER_NS=e2e-intruder

# install_node_agent: deploy/node-agent/ as shipped, its paths moved to where the test
# cluster's kubelet keeps its files (scripts/cluster.sh node-agent; the store at
# $STORE_DIR); before the operator, whose pool pods mount the driver's volumes.
install_node_agent() {
  scripts/cluster.sh node-agent || fail "installing the node agent (scripts/cluster.sh node-agent) failed"
}

# pool_pods: the namespace's running pool pods that are not being deleted, ready or not,
# `NAME IP` a line, oldest first.
pool_pods() {
  kubectl get pods -n "$NS" -l wasmless.io/component=pool --sort-by=.metadata.creationTimestamp \
    -o 'jsonpath={range .items[?(@.status.phase=="Running")]}{.metadata.name} {.status.podIP} {.metadata.deletionTimestamp}{"\n"}{end}' |
    awk 'NF == 2'
}

# store_requests IP OP RESULT: how many `OP`s of the pool pod at IP the node's store answered
# RESULT (its wasmless_code_store_requests_total, all its Functions').
store_requests() {
  { curl -fsS --max-time 2 "http://$1:9090/metrics" || true; } |
    awk -v op="op=\"$2\"" -v result="result=\"$3\"" \
      '/^wasmless_code_store_requests_total\{/ && index($0, op) && index($0, result) { sum += $NF } END { print sum + 0 }'
}

store_answered() { (($(store_requests "$@") >= 1)); }

# replace_a_pool_pod: deletes the oldest running pool pod, waits for a ready pool pod made
# after it was deleted, and sets NEW_POOL_POD and NEW_POOL_IP to its name and address.
replace_a_pool_pod() {
  local old="" before
  # Every pool pod there is, with an address or not: none of them is the replacement.
  before=" $(kubectl get pods -n "$NS" -l wasmless.io/component=pool -o 'jsonpath={.items[*].metadata.name}') "
  read -r old _ < <(pool_pods) || true
  [[ -n $old ]] || fail "no running pool pod in $NS"
  kubectl delete pod "$old" -n "$NS" --wait=false >/dev/null
  NEW_POOL_POD="" NEW_POOL_IP=""
  new_pool_pod_ready() {
    local name ip
    while read -r name ip; do
      [[ $before == *" $name "* ]] && continue
      [[ $(kubectl get pod "$name" -n "$NS" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}') == True ]] || continue
      NEW_POOL_POD=$name NEW_POOL_IP=$ip
      return 0
    done < <(pool_pods)
    return 1
  }
  wait_until 120 "a ready pool pod in place of $old" new_pool_pod_ready
}

node_store() {
  step "the node's code store: a pooled Go Function's code is put on the node once, a new pool pod maps it from there, a changed copy is refused and the code read again, another namespace's pod gets nothing of it, and the Function's own pods map the same copy; the operator follows the agent's coming and going"
  # A body of this run's own: the code's digest is new to the node's store, which outlives
  # a run on the same cluster.
  local body="stored once on the node (run $(date +%s))" manifest port digest object
  manifest=$(python3 -c 'import json,sys; print(json.dumps({
    "apiVersion": "wasmless.io/v1alpha1", "kind": "Function",
    "metadata": {"name": "stored", "namespace": sys.argv[2]},
    "spec": {"function": sys.argv[1], "scale": {"min": 0}}}))' "$(go_handler "$body")" "$NS")
  kubectl apply -f - <<<"$manifest" >/dev/null
  wait_until 240 "stored to be Ready in the pool" phase_is stored Ready
  expect_eq "$(fn_field stored .status.servedBy)" pool "stored's status.servedBy"
  expect_service_answer stored "$body"
  port=$(kubectl get cm stored-pool -n "$NS" -o 'jsonpath={.data.entry\.json}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["port"])')

  # (1) The pool read the code from its ConfigMaps, checked it, and gave it to the agent,
  # which keeps it as a root-owned file no one can write.
  digest=$(fn_field stored .status.codeDigest)
  [[ $digest == sha256:* ]] || fail "stored has no status.codeDigest"
  object=$STORE_DIR/objects/${digest#sha256:}.cwasm
  wait_until 60 "the agent to hold stored's code as $object" test -f "$object"
  expect_eq "$(stat -c '%a %U' "$object")" "444 root" "the stored code's mode and owner"
  echo "    $(($(stat -c %s "$object") >> 20)) MiB of stored's code on the node, put there by the pool"

  # (2) A new pool pod loads the Function (ahead of its first request, or on it): from the
  # store, putting nothing (stored is the namespace's only pooled Function now).
  local name ip shared
  replace_a_pool_pod
  name=$NEW_POOL_POD ip=$NEW_POOL_IP
  expect_answer_at "http://$ip:$port/" "$body" "stored's answer from $name"
  wait_until 30 "$name to map stored's code from the node's store" store_answered "$ip" get found
  expect_eq "$(store_requests "$ip" put stored)" 0 "puts by $name, which found the code stored"
  # Its pages are the node's one copy: on neither of the pool's budgets.
  shared=$({ curl -fsS --max-time 2 "http://$ip:9090/metrics" || true; } |
    awk '/^wasmless_pool_code_bytes\{/ && index($0, "memory=\"shared\"") { print $NF }')
  ((${shared:-0} > 1 << 20)) || fail "$name counts ${shared:-no} bytes of shared code (wasmless_pool_code_bytes{memory=\"shared\"})"
  echo "    $name: $((shared >> 20)) MiB of code shared from the node's store, $(kubectl logs -n "$NS" "$name" | grep -o '"load_ms":[0-9.]*' | tail -1)"

  # (3) Root on the node changes the stored copy: the agent refuses it, the pool reads and
  # checks the code from its ConfigMaps as without a store, and puts it again. The last
  # byte (the ELF section table): a running pool maps these pages, and runs none of them.
  python3 -c 'import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(-1, 2); b = f.read(1); f.seek(-1, 2); f.write(bytes([b[0] ^ 0xff]))' "$object"
  replace_a_pool_pod
  name=$NEW_POOL_POD ip=$NEW_POOL_IP
  expect_answer_at "http://$ip:$port/" "$body" "stored's answer from $name after the change"
  wait_until 30 "$name to be told the stored copy is corrupt" store_answered "$ip" get corrupt
  wait_until 60 "$name to put the code it read again" store_answered "$ip" put stored
  echo "    a changed copy: answered corrupt to $name, which read the code from its ConfigMaps and put it again"

  # (4) Another namespace's pod, and the same probe in the Function's own as the control.
  wait_until 30 "the agent to hold stored's code again" test -f "$object"
  node_store_probe "$NS" "$digest"
  expect_contains "$PROBE_SAID" "get: found" "a pod of $NS asking for stored's code (the control)"
  node_store_intruder "$digest"
  expect_service_answer stored "$body"

  # (5) Pods of its own (scale.min 1) map the same copy, and put nothing.
  local pod_ip=""
  kubectl patch fn stored -n "$NS" --type merge -p '{"spec": {"scale": {"min": 1}}}' >/dev/null
  served_by_pods() { [[ $(fn_field stored .status.servedBy) == pods ]]; }
  wait_until 180 "stored to be served by pods of its own" served_by_pods
  read -r name pod_ip < <(kubectl get pods -n "$NS" -l wasmless.io/function=stored,wasmless.io/component=runtime --field-selector=status.phase=Running \
    -o 'jsonpath={range .items[*]}{.metadata.name} {.status.podIP}{"\n"}{end}') || true
  [[ -n $pod_ip ]] || fail "stored has no running pod of its own"
  wait_until 30 "$name, stored's own pod, to map its code from the node's store" store_answered "$pod_ip" get found
  expect_eq "$(store_requests "$pod_ip" put stored)" 0 "puts by $name, which found the code stored"
  expect_service_answer stored "$body"
  echo "    $name (stored's own pod): its code mapped from the node's store, $(kubectl logs -n "$NS" "$name" | grep -o '"load_ms":[0-9.]*' | tail -1)"

  # (6) The operator's default (--node-code-store auto) follows the agent's CSIDriver: with
  # it gone, new pods would wait for a driver no node serves, so they are made without the
  # store; installed again, with it.
  store_volume_in() { kubectl get deploy "$1" -n "$NS" -o 'jsonpath={.spec.template.spec.volumes[*].csi.driver}'; }
  made_on_store() { [[ $(store_volume_in stored) == code.wasmless.io ]]; }
  made_off_store() { [[ -z $(store_volume_in stored) ]]; }
  kubectl delete csidriver code.wasmless.io >/dev/null
  wait_until 60 "stored's pods to be made without the node's store" made_off_store
  install_node_agent
  wait_until 60 "stored's pods to be made with the node's store again" made_on_store
  kubectl rollout status deploy/stored -n "$NS" --timeout=120s >/dev/null || fail "stored's pods did not roll back onto the store"
  expect_service_answer stored "$body"
  echo "    the agent's CSIDriver removed and installed again: the operator rolled stored's pods off the store and back"
  kubectl delete fn stored -n "$NS" --wait=false >/dev/null
  ok
}

# The probe a tenant's pod runs: C, compiled in the pod by the builder image's gcc, for it
# passes a file beside its message (SCM_RIGHTS), which no interpreter there can. It asks for
# argv[1]; with a second argument, puts under argv[1] a sealed memory file of other bytes;
# then tries to write in its volume. A line per try.
NODE_STORE_PROBE='#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static const char *ask(const char *message, int fd) {
  static char reply[65536];
  struct sockaddr_un address = {.sun_family = AF_UNIX, .sun_path = "/code-store/agent.sock"};
  int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  if (connect(s, (struct sockaddr *)&address, sizeof address) < 0) return strerror(errno);
  char control[CMSG_SPACE(sizeof fd)];
  memset(control, 0, sizeof control);
  struct iovec text = {(void *)message, strlen(message)};
  struct msghdr m = {.msg_iov = &text, .msg_iovlen = 1};
  if (fd >= 0) {
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fd);
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  if (sendmsg(s, &m, 0) < 0) return strerror(errno);
  ssize_t n = recv(s, reply, sizeof reply - 1, 0);
  reply[n > 0 ? n : 0] = 0;
  reply[strcspn(reply, "\n")] = 0;
  close(s);
  return reply;
}

int main(int argc, char **argv) {
  char message[256];
  snprintf(message, sizeof message, "get %s", argv[1]);
  printf("get: %s\n", ask(message, -1));
  if (argc > 2) {
    static const char forged[] = "\x7f" "ELF, not the code this digest pins";
    int fd = memfd_create("forged", MFD_ALLOW_SEALING);
    if (write(fd, forged, sizeof forged) < 0) perror("write");
    fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK);
    snprintf(message, sizeof message, "put %s", argv[1]);
    printf("put: %s\n", ask(message, fd));
  }
  int written = open("/code-store/probe", O_CREAT | O_WRONLY, 0600);
  printf("write: %s\n", written >= 0 ? "written" : strerror(errno));
  return 0;
}'

# node_store_probe NAMESPACE DIGEST [forge [CLAIMED_NAMESPACE]]: runs the probe in a pod of
# NAMESPACE, as restricted as Pod Security lets a tenant be, with the driver's volume (whose
# attributes claim CLAIMED_NAMESPACE, when given); sets PROBE_SAID to what it printed.
node_store_probe() {
  local namespace=$1 digest=$2 forge=${3:-} claimed=${4:-}
  kubectl delete pod store-probe -n "$namespace" --ignore-not-found --wait=true >/dev/null
  python3 -c 'import json,sys; namespace, source, digest, forge, claimed = sys.argv[1:6]
volume = {"driver": "code.wasmless.io", "readOnly": True}
if claimed: volume["volumeAttributes"] = {"csi.storage.k8s.io/pod.namespace": claimed}
print(json.dumps({
  "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "store-probe", "namespace": namespace},
  "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [{"name": "probe", "image": "wasmless/builder:0.1.0",
      "command": ["sh", "-c", "printf %s \"$0\" >/tmp/probe.c && gcc -o /tmp/probe /tmp/probe.c && exec /tmp/probe \"$@\"",
                  source, digest] + ([forge] if forge else []),
      "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
      # Not read-only here: the kubelet mounts the volume read-only whatever the mount says.
      "volumeMounts": [{"name": "code", "mountPath": "/code-store"}, {"name": "tmp", "mountPath": "/tmp"}]}],
    "volumes": [{"name": "code", "csi": volume}, {"name": "tmp", "emptyDir": {}}]}}))' \
    "$namespace" "$NODE_STORE_PROBE" "$digest" "$forge" "$claimed" | kubectl apply -f - >/dev/null
  probe_ended() { [[ $(kubectl get pod store-probe -n "$namespace" -o 'jsonpath={.status.phase}') == @(Succeeded|Failed) ]]; }
  wait_until 120 "the probe in $namespace to end" probe_ended
  PROBE_SAID=$(kubectl logs store-probe -n "$namespace")
  sed "s/^/    probe in $namespace: /" <<<"$PROBE_SAID"
  kubectl delete pod store-probe -n "$namespace" --wait=false >/dev/null
}

# node_store_intruder DIGEST: a pod of another namespace mounts the driver's volume, claims
# the Functions' namespace in its attributes (the kubelet writes its own over them), asks
# for DIGEST, and puts other bytes under it.
node_store_intruder() {
  kubectl delete namespace "$INTRUDER_NS" --ignore-not-found --wait=true --timeout=120s >/dev/null
  kubectl create namespace "$INTRUDER_NS" >/dev/null
  kubectl label namespace "$INTRUDER_NS" pod-security.kubernetes.io/enforce=restricted >/dev/null
  node_store_probe "$INTRUDER_NS" "$1" forge "$NS"
  expect_contains "$PROBE_SAID" "get: absent" "the intruder asking for stored's code"
  expect_contains "$PROBE_SAID" "put: refused digest" "the intruder putting other bytes under stored's digest"
  expect_contains "$PROBE_SAID" "write: Read-only file system" "the intruder writing in its volume"
  # The store's files are the node's: a tenant cannot mount them (hostPath) past Pod
  # Security. A pod restricted in all else, so that the refusal is the hostPath's.
  local refused
  refused=$(python3 -c 'import json,sys; print(json.dumps({
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "store-reader", "namespace": sys.argv[1]},
    "spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
      "containers": [{"name": "reader", "image": "wasmless/builder:0.1.0",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "store", "mountPath": "/store"}]}],
      "volumes": [{"name": "store", "hostPath": {"path": sys.argv[2]}}]}}))' "$INTRUDER_NS" "$STORE_DIR" |
    kubectl apply --dry-run=server -f - 2>&1 || true)
  expect_contains "$refused" "violates PodSecurity" "a pod of $INTRUDER_NS mounting the store's directory"
  expect_contains "$refused" "hostPath" "why Pod Security refused the pod mounting the store's directory"
  kubectl delete namespace "$INTRUDER_NS" --wait=false >/dev/null
}
