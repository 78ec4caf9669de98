#!/usr/bin/env bash
# A single-node Kubernetes for the tests, made of upstream components run as local
# processes that this script owns (as kubernetes' hack/local-up-cluster.sh does):
#
#   scripts/cluster.sh up       build what is missing, start the cluster, print the kubeconfig
#   scripts/cluster.sh env      print `export KUBECONFIG=… PATH=…` for a shell to eval
#   scripts/cluster.sh down     stop what `up` started and remove its containers, mounts, state
#   scripts/cluster.sh load ARCHIVE...   import image archives (scripts/build-images.sh) for the kubelet
#   scripts/cluster.sh build    only build (and cache) Kubernetes, etcd, CoreDNS, the pause and metrics-server images
#   scripts/cluster.sh status   say what runs
#   scripts/cluster.sh node-agent   install deploy/node-agent/ (the node's code store) with its
#                               paths moved to this cluster's kubelet; waits for its CSI driver
#
# Kubernetes is built with `go build` from the k8s.io/kubernetes module at KUBE_VERSION, and
# etcd from go.etcd.io/etcd/server/v3 at ETCD_VERSION, cached under ~/.cache/wasmless/kube/;
# containerd, runc and the CNI plugins are Debian's. metrics-server (built by scripts/lib.sh's
# go_tool, its image cached beside Kubernetes) runs as a pod behind the API server's
# aggregation layer, so `kubectl top` and an HPA's CPU target work. CoreDNS (the same shared
# Go tools module) is the cluster's DNS, a process on the node, so Service names resolve in
# pods as on any cluster. Every process listens on 127.0.0.1 or on the pod bridge's gateway
# address (GATEWAY): traffic stays on this machine's loopback, the bridge and the pods'
# namespaces.
# Needs root. Each process's log is in $CLUSTER_DIR/logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/sbin:/sbin   # runc, iptables, conntrack
SAY_AS=cluster
# shellcheck source=scripts/lib.sh
. scripts/lib.sh   # say, wait_until, the Go tools (metrics-server, CoreDNS) and their versions

KUBE_VERSION=1.34.4
# Debian's etcd (3.4.23) is below what 1.34's API server needs: its watch cache fell behind
# ("Too large resource version") and served stale objects, so controllers never saw a
# Deployment become available. 3.6 is the etcd line Kubernetes 1.34 is released with.
ETCD_VERSION=3.6.16
CACHE=$WASMLESS_CACHE
KUBE_BIN=$CACHE/kube/v$KUBE_VERSION/bin
ETCD=$CACHE/kube/etcd-v$ETCD_VERSION/etcd
CLUSTER_DIR=${WASMLESS_CLUSTER_DIR:-/var/lib/wasmless-cluster}
# The operator's default build cache (--build-cache hostPath:…): prepared on `up` as a node
# admin would (the builder's uid, 0700), removed on `down`, so each cluster starts cold.
BUILD_CACHE=/var/lib/wasmless/builds
NODE=wasmless-node
BRIDGE=wasmless0
POD_CIDR=10.244.0.0/24
GATEWAY=10.244.0.1              # the bridge's address: API server, kubelet, DNS, registry, node IP
SERVICE_CIDR=10.96.0.0/20       # 4094 Services: bench/cluster.sh density makes a thousand
KUBERNETES_SERVICE_IP=10.96.0.1 # the `kubernetes` Service, the range's first address
CLUSTER_DOMAIN=cluster.local
DNS_IP=$GATEWAY                 # CoreDNS, the kubelet's clusterDNS (start_dns says why there)
DNS_READY=127.0.0.1:8181        # CoreDNS's readiness: 200 once it has listed the Services
PAUSE_IMAGE=docker.io/wasmless/pause:$KUBE_VERSION
METRICS_SERVER_IMAGE=docker.io/wasmless/metrics-server:$METRICS_SERVER_VERSION
METRICS_SERVER_ARCHIVE=$CACHE/kube/metrics-server-$METRICS_SERVER_VERSION.tar
COMPONENTS=(etcd containerd kube-apiserver kube-controller-manager kube-scheduler coredns kubelet kube-proxy)

PKI=$CLUSTER_DIR/pki
PIDS=$CLUSTER_DIR/pids
LOGS=$CLUSTER_DIR/logs
CONTAINERD_SOCK=$CLUSTER_DIR/containerd/containerd.sock
ADMIN_KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
FRONT_PROXY_CLIENT=front-proxy-client

die() {
  say "$*"
  say "each component's log is in $LOGS/"
  exit 1
}

# ---- build ---------------------------------------------------------------------------

# The Kubernetes binaries, from a module that requires k8s.io/kubernetes and replaces each
# staging module it requires at v0.0.0 with the matching v0.Y.Z (generated from its go.mod).
build_kube() {
  local wanted=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
  local missing=0 name
  for name in "${wanted[@]}"; do [[ -x $KUBE_BIN/$name ]] || missing=1; done
  [[ $missing == 0 ]] && return
  command -v go >/dev/null || die "Go is needed to build Kubernetes (scripts/setup.sh installs it)"
  local module=$CACHE/kube/v$KUBE_VERSION/module staging_version=v0.${KUBE_VERSION#1.}  # 1.34.4 -> v0.34.4
  mkdir -p "$module" "$KUBE_BIN"
  say "building Kubernetes v$KUBE_VERSION from the Go module proxy into $KUBE_BIN (once; ~15 min on 2 cores)"
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    printf 'module wasmless.local/kube\n\ngo 1.24.0\n\nrequire k8s.io/kubernetes v%s\n\nreplace (\n' "$KUBE_VERSION"
    awk -v v="$staging_version" '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" { printf "\t%s => %s %s\n", $1, $1, v }' "$gomod"
    printf ')\n'
  } >"$module/go.mod"
  local packages=()
  for name in "${wanted[@]}"; do packages+=("k8s.io/kubernetes/cmd/$name"); done
  # What `kubectl version` and the node report; without it they say v0.0.0-master.
  local version_flags="" pkg minor
  minor=$(cut -d. -f2 <<<"$KUBE_VERSION")
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    version_flags+=" -X $pkg.gitVersion=v$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    version_flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  (
    cd "$module"
    export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local
    go get "${packages[@]/%/@v$KUBE_VERSION}" >/dev/null 2>&1 || go get "${packages[@]/%/@v$KUBE_VERSION}"
    go build "${GO_BUILD_FLAGS[@]}" -ldflags "-s -w$version_flags" -o "$KUBE_BIN/" "${packages[@]}"
  )
}

build_etcd() {
  [[ -x $ETCD ]] && return
  local module=${ETCD%/etcd}/module
  mkdir -p "$module"
  say "building etcd v$ETCD_VERSION from the Go module proxy (once; under a minute)"
  printf 'module wasmless.local/etcd\n\ngo 1.24.0\n' >"$module/go.mod"
  (
    cd "$module"
    export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local
    go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >/dev/null 2>&1 || go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
    go build "${GO_BUILD_FLAGS[@]}" -ldflags "-s -w" -o "$ETCD" go.etcd.io/etcd/server/v3
  )
}

# metrics-server, the resource metrics API (`kubectl top`, an HPA's CPU target), built from the
# sigs.k8s.io/metrics-server module at METRICS_SERVER_VERSION (scripts/lib.sh's shared Go
# tools module), as a FROM scratch image like the project's own.
build_metrics_server() {
  [[ -f $METRICS_SERVER_ARCHIVE ]] && return
  local binary rootfs
  binary=$(metrics_server_tool)
  rootfs=$(mktemp -d)
  install -D -m 0555 "$binary" "$rootfs/metrics-server"
  mkdir -m 1777 "$rootfs/tmp"
  scripts/image-archive.sh "$rootfs" "$METRICS_SERVER_IMAGE" "$METRICS_SERVER_ARCHIVE" --user 65534:65534 -- /metrics-server >&2
  rm -rf "$rootfs"
}

# CoreDNS with the plugins the cluster's DNS uses (scripts/cluster/coredns/main.go), a binary
# on the node like the Kubernetes components.
build_coredns() {
  COREDNS=$(coredns_tool)
}

# The sandbox ("pause") image: one static binary that holds a pod's namespaces open.
build_pause() {
  local archive=$CACHE/kube/pause-$KUBE_VERSION.tar
  [[ -f $archive ]] && return
  local rootfs
  rootfs=$(mktemp -d)
  gcc -static -Os -s -o "$rootfs/pause" scripts/cluster/pause.c
  scripts/image-archive.sh "$rootfs" "$PAUSE_IMAGE" "$archive" --user 65535:65535 -- /pause >&2
  rm -rf "$rootfs"
}

# ---- certificates and kubeconfigs ------------------------------------------------------

# sign NAME SUBJECT [SANS [CA]]: a key and a certificate signed by CA (the cluster's by default).
sign() {
  local name=$1 subject=$2 sans=${3:-} ca=${4:-ca}
  openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subject" -out "$PKI/$name.csr" 2>/dev/null
  local ext=$PKI/$name.ext
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' >"$ext"
  [[ -n $sans ]] && printf 'subjectAltName=%s\n' "$sans" >>"$ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" -CAcreateserial \
    -days 30 -sha256 -extfile "$ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$ext"
}

# kubeconfig NAME: a kubeconfig that authenticates with the certificate NAME.
kubeconfig() {
  local name=$1
  cat >"$CLUSTER_DIR/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: wasmless
  cluster:
    server: https://$GATEWAY:6443
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $name
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$name.crt")
    client-key-data: $(base64 -w0 "$PKI/$name.key")
contexts:
- name: wasmless
  context: {cluster: wasmless, user: $name}
current-context: wasmless
EOF
}

# new_ca NAME CN: a self-signed CA.
new_ca() {
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$PKI/$1.key" -out "$PKI/$1.crt" -days 30 \
    -subj "/CN=$2" 2>/dev/null
}

make_pki() {
  [[ -f $ADMIN_KUBECONFIG ]] && return
  mkdir -p "$PKI"
  new_ca ca wasmless-test-cluster-ca
  # The API aggregation layer's own CA: the API server proxies to an aggregated API server
  # (metrics-server) with this client certificate, and the user it authenticated in
  # X-Remote-* headers, which the aggregated server believes only from this CA's FRONT_PROXY_CLIENT.
  new_ca front-proxy-ca wasmless-test-cluster-front-proxy-ca
  sign front-proxy-client "/CN=$FRONT_PROXY_CLIENT" "" front-proxy-ca
  sign apiserver "/CN=kube-apiserver" \
    "IP:$GATEWAY,IP:127.0.0.1,IP:$KUBERNETES_SERVICE_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
  sign apiserver-kubelet-client "/O=wasmless:apiserver/CN=kube-apiserver-kubelet-client"
  sign kubelet-serving "/CN=$NODE" "IP:$GATEWAY,DNS:$NODE"
  sign admin "/O=system:masters/CN=wasmless-admin"
  sign kubelet "/O=system:nodes/CN=system:node:$NODE"
  sign controller-manager "/CN=system:kube-controller-manager"
  sign scheduler "/CN=system:kube-scheduler"
  sign kube-proxy "/CN=system:kube-proxy"
  sign prometheus "/CN=wasmless-prometheus"
  sign coredns "/CN=wasmless-coredns"
  openssl genrsa -out "$PKI/service-account.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/service-account.key" -pubout -out "$PKI/service-account.pub" 2>/dev/null
  local name
  for name in admin kubelet controller-manager scheduler kube-proxy prometheus coredns; do kubeconfig "$name"; done
}

# ---- processes -------------------------------------------------------------------------

running() { [[ -f $PIDS/$1 ]] && kill -0 "$(cat "$PIDS/$1")" 2>/dev/null; }

# start NAME COMMAND...: runs it in the background, its output in logs/NAME.log, its PID recorded.
start() {
  local name=$1
  shift
  running "$name" && return
  mkdir -p "$PIDS" "$LOGS"
  setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$PIDS/$name"
}

kubectl() { "$KUBE_BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }
ctr_() { ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }

# ---- up --------------------------------------------------------------------------------

# Remembers a host setting before changing it, so `down` can put it back.
remember() {
  local key=$1 value=$2
  mkdir -p "$CLUSTER_DIR/host"
  [[ -f $CLUSTER_DIR/host/$key ]] || printf '%s\n' "$value" >"$CLUSTER_DIR/host/$key"
}

setup_host() {
  remember ip_forward "$(cat /proc/sys/net/ipv4/ip_forward)"
  remember bridge_nf_call_iptables "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || echo 0)"
  remember root_propagation "$(findmnt -no PROPAGATION /)"
  ls /var/run/netns 2>/dev/null >"$CLUSTER_DIR/host/netns.before" || true
  sysctl -qw net.ipv4.ip_forward=1
  # Service traffic between pods on the bridge must pass kube-proxy's iptables rules.
  sysctl -qw net.bridge.bridge-nf-call-iptables=1
  # The kubelet's volume mounts must propagate into containers (as kind does).
  mount --make-rshared /
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$GATEWAY/${POD_CIDR#*/}" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    touch "$CLUSTER_DIR/host/bridge.created"
  fi
  # A ClusterIP that kube-proxy has not programmed yet is not DNATed: without this route a
  # process on the node would reach it through the default route, off the machine (where
  # this machine's network answered the API server's first dial of metrics-server with a
  # 404, on a connection it then kept). On the bridge it goes nowhere instead.
  if [[ -z $(ip route show "$SERVICE_CIDR") ]]; then
    ip route add "$SERVICE_CIDR" dev "$BRIDGE"
    touch "$CLUSTER_DIR/host/service-route.created"
  fi
}

start_etcd() {
  start etcd "$ETCD" --name "$NODE" --data-dir "$CLUSTER_DIR/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster "$NODE=http://127.0.0.1:2380" --quota-backend-bytes 2147483648 \
    --listen-metrics-urls http://127.0.0.1:2381
  wait_until 30 etcd curl -fsS http://127.0.0.1:2381/health
}

start_containerd() {
  local dir=$CLUSTER_DIR/containerd
  mkdir -p "$dir/certs.d/_default" "$CLUSTER_DIR/cni/net.d"
  # No registry but the test's own: any pull that is not of an imported image fails at once
  # on loopback instead of leaving the machine.
  printf 'server = "http://127.0.0.1:1"\n[host."http://127.0.0.1:1"]\n  capabilities = ["pull", "resolve"]\n' \
    >"$dir/certs.d/_default/hosts.toml"
  cat >"$dir/config.toml" <<EOF
version = 2
root = "$dir/root"
state = "$dir/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$dir/containerd.sock.ttrpc"
[debug]
  address = "$dir/debug.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  enable_selinux = false
  # This machine refuses to lower oom_score_adj below the caller's (even to root): the
  # kubelet's negative scores for the sandbox and Guaranteed pods are raised to containerd's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$CLUSTER_DIR/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$dir/certs.d"
EOF
  cat >"$CLUSTER_DIR/cni/net.d/10-wasmless.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "wasmless",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$CLUSTER_DIR/cni/ipam",
              "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$GATEWAY"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  start containerd containerd --config "$dir/config.toml"
  wait_until 30 containerd ctr --address "$CONTAINERD_SOCK" version
  import_image "$CACHE/kube/pause-$KUBE_VERSION.tar"
}

# import_image ARCHIVE: makes an image archive available to the kubelet (the CRI's namespace).
import_image() {
  ctr_ images import "$1" >/dev/null
}

# The aggregation layer is the --requestheader-* and --proxy-client-* flags (make_pki says
# why), and --enable-aggregator-routing: the API server dials an aggregated API server's
# endpoints, pod IPs on the bridge, not its ClusterIP, which only works from the node once
# kube-proxy has caught up with the new Service, while the first dial's connection is kept.
start_apiserver() {
  start kube-apiserver "$KUBE_BIN/kube-apiserver" \
    --etcd-servers http://127.0.0.1:2379 \
    --bind-address "$GATEWAY" --advertise-address "$GATEWAY" --secure-port 6443 \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" \
    --kubelet-preferred-address-types InternalIP \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/service-account.pub" \
    --service-account-signing-key-file "$PKI/service-account.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction \
    --allow-privileged=false \
    --profiling=false \
    --requestheader-client-ca-file "$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names "$FRONT_PROXY_CLIENT" \
    --requestheader-username-headers X-Remote-User \
    --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$PKI/front-proxy-client.crt" \
    --proxy-client-key-file "$PKI/front-proxy-client.key" \
    --enable-aggregator-routing=true
  wait_until 90 kube-apiserver kubectl get --raw /readyz
  # The API server's kubelet client may read logs, exec and port-forward.
  kubectl create clusterrolebinding wasmless:apiserver-kubelet-api-admin --clusterrole system:kubelet-api-admin \
    --user kube-apiserver-kubelet-client --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  # The test's Prometheus discovers pods and services across namespaces, and reads nothing else.
  kubectl apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: wasmless:prometheus}
rules:
- apiGroups: [""]
  resources: [pods, services, endpoints]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: wasmless:prometheus}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: wasmless:prometheus}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: wasmless-prometheus}]
EOF
}

start_controllers() {
  # An HPA syncs every 5 s rather than 15 (and metrics-server samples every 10 s, its least):
  # the e2e's HPA step waits on them, and one node holds few HPAs.
  start kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
    --kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false \
    --use-service-account-credentials \
    --service-account-private-key-file "$PKI/service-account.key" \
    --root-ca-file "$PKI/ca.crt" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --horizontal-pod-autoscaler-sync-period 5s
  cat >"$CLUSTER_DIR/scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: $CLUSTER_DIR/scheduler.kubeconfig}
leaderElection: {leaderElect: false}
EOF
  start kube-scheduler "$KUBE_BIN/kube-scheduler" --config "$CLUSTER_DIR/scheduler.yaml" \
    --bind-address 127.0.0.1 \
    --authentication-kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig"
}

# CoreDNS, the cluster's DNS: a process on the node, on the bridge's gateway address, which is
# the kubelet's clusterDNS. Pods ask it over the bridge as they reach the API server, and the
# kubelet writes them a resolv.conf of `search <ns>.svc.cluster.local svc.cluster.local
# cluster.local`, `nameserver 10.244.0.1` and `options ndots:5`. Not a pod behind a
# `kube-dns` Service (what kubeadm makes): DNS would then wait for a pod to be scheduled and
# for kube-proxy's rules, and each query would pass a UDP DNAT; pods see no difference but
# the nameserver's address, and nothing reads that Service.
# It answers for cluster.local and the Service range's reverse zone (PTR of a ClusterIP) from
# the API server, as a user that may only list and watch what the kubernetes plugin reads, and
# REFUSED for every other name: it has no upstream (nothing leaves this machine), and REFUSED
# says "not this server's" where NXDOMAIN would say the name exists nowhere, and be cached.
# Answers live 5 s (the plugin's default TTL, which the cache keeps to), so a Service made
# after a first miss resolves within 5 s. It parses what pods send, so it runs as nobody
# with only the capability to bind port 53.
start_dns() {
  kubectl apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: wasmless:coredns}
rules:
- apiGroups: [""]
  resources: [services, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: wasmless:coredns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: wasmless:coredns}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: wasmless-coredns}]
EOF
  local dir=$CLUSTER_DIR/coredns
  mkdir -p "$dir"
  install -m 0400 -o 65534 -g 65534 "$CLUSTER_DIR/coredns.kubeconfig" "$dir/kubeconfig"
  cat >"$dir/Corefile" <<EOF
$CLUSTER_DOMAIN $SERVICE_CIDR {
  bind $DNS_IP
  ready $DNS_READY
  errors
  log . {
    class denial error
  }
  loadbalance
  cache 30
  kubernetes $CLUSTER_DOMAIN $SERVICE_CIDR {
    kubeconfig $dir/kubeconfig wasmless
  }
}
EOF
  allow_dns_from_pods
  start coredns setpriv --reuid 65534 --regid 65534 --clear-groups \
    --inh-caps +net_bind_service --ambient-caps +net_bind_service \
    "$COREDNS" -conf "$dir/Corefile"
  wait_until 60 "CoreDNS (ready once it has listed the Services)" curl -fsS "http://$DNS_READY/ready"
  local answer
  answer=$(dig +short +time=2 +tries=1 @"$DNS_IP" "kubernetes.default.svc.$CLUSTER_DOMAIN" A)
  [[ $answer == "$KUBERNETES_SERVICE_IP" ]] ||
    die "CoreDNS answers '$answer' for kubernetes.default.svc.$CLUSTER_DOMAIN, not $KUBERNETES_SERVICE_IP"
}

# Pods reach CoreDNS over the bridge, and the node's own processes over loopback; nothing else
# does. First in INPUT, so that a host refusing by default would still let the pods ask.
allow_dns_from_pods() {
  iptables -N WASMLESS-DNS 2>/dev/null || iptables -F WASMLESS-DNS
  iptables -A WASMLESS-DNS -i "$BRIDGE" -j ACCEPT
  iptables -A WASMLESS-DNS -i lo -j ACCEPT
  iptables -A WASMLESS-DNS -j DROP
  local proto
  for proto in udp tcp; do
    iptables -C INPUT -d "$DNS_IP" -p "$proto" --dport 53 -j WASMLESS-DNS 2>/dev/null ||
      iptables -I INPUT -d "$DNS_IP" -p "$proto" --dport 53 -j WASMLESS-DNS
  done
}

# This machine: cgroup v1 (hybrid) with no systemd, no swap, and a nested memory cgroup.
start_kubelet() {
  mkdir -p "$CLUSTER_DIR/kubelet"
  cat >"$CLUSTER_DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $GATEWAY
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
clusterDomain: $CLUSTER_DOMAIN
clusterDNS: [$DNS_IP]
resolvConf: ""
EOF
  start kubelet "$KUBE_BIN/kubelet" --config "$CLUSTER_DIR/kubelet.yaml" \
    --kubeconfig "$CLUSTER_DIR/kubelet.kubeconfig" --root-dir "$CLUSTER_DIR/kubelet" \
    --hostname-override "$NODE" --node-ip "$GATEWAY"
  wait_until 120 "the node" kubectl wait --for=condition=Ready "node/$NODE" --timeout=5s
}

start_proxy() {
  cat >"$CLUSTER_DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $CLUSTER_DIR/kube-proxy.kubeconfig}
mode: iptables
hostnameOverride: $NODE
clusterCIDR: $POD_CIDR
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$GATEWAY/32"]
conntrack: {maxPerCore: 0}
EOF
  start kube-proxy "$KUBE_BIN/kube-proxy" --config "$CLUSTER_DIR/kube-proxy.yaml"
  wait_until 60 kube-proxy curl -fsS http://127.0.0.1:10256/healthz
}

# metrics-server as a pod (scripts/cluster/metrics-server.yaml), behind the API server's
# aggregation layer: `kubectl top`, and the resource metrics an HPA's CPU target reads.
start_metrics_server() {
  import_image "$METRICS_SERVER_ARCHIVE"
  sed "s|@IMAGE@|$METRICS_SERVER_IMAGE|" scripts/cluster/metrics-server.yaml | kubectl apply -f - >/dev/null
}

# Available once metrics-server answers; it has metrics once it has scraped the kubelet.
metrics_available() {
  [[ $(kubectl get apiservice v1beta1.metrics.k8s.io -o 'jsonpath={.status.conditions[?(@.type=="Available")].status}') == True ]] &&
    kubectl top node "$NODE"
}

up() {
  [[ $(id -u) == 0 ]] || die "the cluster needs root (it runs the kubelet and containerd)"
  if running kube-apiserver && running kubelet && kubectl get --raw /readyz >/dev/null 2>&1; then
    say "already up"
    echo "$ADMIN_KUBECONFIG"
    return
  fi
  build_kube
  build_etcd
  build_coredns
  build_pause
  build_metrics_server
  mkdir -p "$CLUSTER_DIR"
  install -d -o 65532 -g 65532 -m 0700 "$BUILD_CACHE"
  setup_host
  make_pki
  start_etcd
  start_containerd
  start_apiserver
  start_controllers
  start_dns
  start_kubelet
  start_proxy
  start_metrics_server
  wait_until 60 "the default ServiceAccount" kubectl get serviceaccount default
  wait_until 120 "the metrics API (metrics-server)" metrics_available
  say "up: Kubernetes v$KUBE_VERSION, node $NODE, API https://$GATEWAY:6443; logs in $LOGS"
  echo "$ADMIN_KUBECONFIG"
}

# ---- down ------------------------------------------------------------------------------

# stop NAME...: SIGTERM to each (together: the API server alone takes ~12 s to drain),
# SIGKILL to any still there after 15 s.
stop() {
  local name pid pids=()
  for name in "$@"; do
    [[ -f $PIDS/$name ]] || continue
    pid=$(cat "$PIDS/$name")
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
    rm -f "$PIDS/$name"
  done
  local deadline=$((SECONDS + 15))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}

# The containers' processes: shims started by this cluster's containerd.
shim_pids() { pgrep -f "containerd-shim.*-address $CONTAINERD_SOCK" || true; }

# Mount points under the cluster's directory, deepest first.
cluster_mounts() { findmnt -rn -o TARGET | grep -F "$CLUSTER_DIR" | awk '{ print length, $0 }' | sort -rn | cut -d' ' -f2- || true; }

new_netns() {
  local before=$CLUSTER_DIR/host/netns.before
  [[ -f $before ]] || return 0
  comm -13 <(sort "$before") <(ls /var/run/netns 2>/dev/null | sort) | grep '^cni-' || true
}

down() {
  [[ -d $CLUSTER_DIR ]] || { say "not up"; return; }
  stop kube-proxy kube-scheduler kube-controller-manager kubelet coredns kube-apiserver
  # The pods' containers outlive the kubelet: kill them through containerd, then its shims.
  if running containerd; then
    local task
    for task in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true; done
    sleep 1
    for task in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$task" >/dev/null 2>&1 || true; done
    for task in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$task" >/dev/null 2>&1 || true; done
  fi
  stop containerd
  local pid
  for pid in $(shim_pids); do kill -KILL "$pid" 2>/dev/null || true; done
  stop etcd
  local netns
  for netns in $(new_netns); do ip netns delete "$netns" 2>/dev/null || umount -l "/var/run/netns/$netns" 2>/dev/null || true; rm -f "/var/run/netns/$netns"; done
  local mountpoint
  while read -r mountpoint; do [[ -n $mountpoint ]] && umount -l "$mountpoint" 2>/dev/null || true; done < <(cluster_mounts)
  # kube-proxy's rules, the kubelet's, then the host settings as they were before `up`.
  [[ -x $KUBE_BIN/kube-proxy ]] && "$KUBE_BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
  remove_kubelet_chains
  remove_dns_rules
  [[ -f $CLUSTER_DIR/host/service-route.created ]] && ip route delete "$SERVICE_CIDR" dev "$BRIDGE" 2>/dev/null || true
  [[ -f $CLUSTER_DIR/host/bridge.created ]] && ip link delete "$BRIDGE" 2>/dev/null || true
  local host=$CLUSTER_DIR/host
  [[ -f $host/ip_forward ]] && sysctl -qw net.ipv4.ip_forward="$(cat "$host/ip_forward")"
  [[ -f $host/bridge_nf_call_iptables ]] && sysctl -qw net.bridge.bridge-nf-call-iptables="$(cat "$host/bridge_nf_call_iptables")" || true
  [[ -f $host/root_propagation ]] && [[ $(cat "$host/root_propagation") == private ]] && mount --make-rprivate /
  rm -rf "$CLUSTER_DIR" "$BUILD_CACHE"
  check_clean
  say "down: no process, container, mount or network of the cluster is left"
}

# The chains the kubelet makes (kube-proxy --cleanup leaves them): KUBE-FIREWALL, jumped to
# from INPUT and OUTPUT, and the canaries it watches for a flushed table.
remove_kubelet_chains() {
  local tool table chain
  for tool in iptables ip6tables; do
    for table in filter nat mangle; do
      while "$tool" -t "$table" -D INPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
      while "$tool" -t "$table" -D OUTPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
      for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
        "$tool" -t "$table" -F "$chain" 2>/dev/null && "$tool" -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  done
}

remove_dns_rules() {
  local proto
  for proto in udp tcp; do
    while iptables -D INPUT -d "$DNS_IP" -p "$proto" --dport 53 -j WASMLESS-DNS 2>/dev/null; do :; done
  done
  iptables -F WASMLESS-DNS 2>/dev/null && iptables -X WASMLESS-DNS 2>/dev/null || true
}

# Fails, naming them, if any of the cluster's processes, mounts or links is still there.
check_clean() {
  local left=()
  local name
  for name in "${COMPONENTS[@]}"; do
    pgrep -f "^(/[^ ]*/)?$name( |$)" >/dev/null && left+=("process $name")
  done
  [[ -n $(shim_pids) ]] && left+=("containerd shims")
  [[ -n $(cluster_mounts) ]] && left+=("mounts under $CLUSTER_DIR")
  ip link show "$BRIDGE" >/dev/null 2>&1 && left+=("bridge $BRIDGE")
  # Each output taken whole, not piped to `grep -q`: under pipefail a grep leaving at its
  # first match can fail the pipeline with the writer's SIGPIPE, and hide what is left.
  [[ -n $(ip route show "$SERVICE_CIDR") ]] && left+=("route to $SERVICE_CIDR")
  local rules
  rules=$(iptables-save 2>/dev/null || true)
  [[ $rules == *KUBE-* ]] && left+=("iptables chains KUBE-*")
  [[ $rules == *WASMLESS-* ]] && left+=("iptables chain WASMLESS-DNS")
  [[ -e $CLUSTER_DIR ]] && left+=("$CLUSTER_DIR")
  [[ ${#left[@]} -eq 0 ]] || die "left behind: ${left[*]}"
}

# ---- commands --------------------------------------------------------------------------

status() {
  local name
  for name in "${COMPONENTS[@]}"; do
    if running "$name"; then echo "$name: running (pid $(cat "$PIDS/$name"))"; else echo "$name: stopped"; fi
  done
}

# deploy/node-agent/ as shipped, its host paths moved to where this cluster's kubelet keeps
# its files (--root-dir) and the store to $CLUSTER_DIR/code-store (`down` removes both);
# done once the kubelet has registered the CSI driver, so pods mounting it can start.
install_node_agent() {
  running kube-apiserver || die "the cluster is not up"
  local kubectl=("$KUBE_BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG")
  "${kubectl[@]}" kustomize deploy/node-agent |
    sed "s#/var/lib/kubelet#$CLUSTER_DIR/kubelet#g; s#/var/lib/wasmless/code-store#$CLUSTER_DIR/code-store#g" |
    "${kubectl[@]}" apply -f - >/dev/null
  "${kubectl[@]}" rollout status ds/wasmless-node-agent -n wasmless-node --timeout=120s >/dev/null
  driver_registered() {
    [[ $("${kubectl[@]}" get csinode -o 'jsonpath={.items[*].spec.drivers[*].name}') == *code.wasmless.io* ]]
  }
  wait_until 60 "the kubelet to register the CSI driver code.wasmless.io" driver_registered
  say "node agent installed; its store: $CLUSTER_DIR/code-store"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  env)
    printf 'export KUBECONFIG=%q PATH=%q:"$PATH"\n' "$ADMIN_KUBECONFIG" "$KUBE_BIN"
    printf 'export WASMLESS_CLUSTER_DIR=%q WASMLESS_CLUSTER_GATEWAY=%q WASMLESS_CLUSTER_DNS=%q\n' "$CLUSTER_DIR" "$GATEWAY" "$DNS_IP"
    ;;
  load)
    shift
    running containerd || die "the cluster is not up"
    for archive in "$@"; do import_image "$archive"; say "loaded $archive"; done
    ;;
  build) build_kube; build_etcd; build_coredns; build_pause; build_metrics_server ;;
  status) status ;;
  node-agent) install_node_agent ;;
  *) echo "usage: $0 up | down | env | load ARCHIVE... | build | status | node-agent" >&2; exit 2 ;;
esac
