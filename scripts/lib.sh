# shellcheck shell=bash
# Shared by the project's shell scripts (the test cluster, e2e, the benchmarks, the Helm
# check, the set-up): how they speak, fail and wait, and the Go tools they build. Source it
# after setting SAY_AS, the word every line of the script's own starts with.

say() { printf '[%s] %s\n' "${SAY_AS:-wasmless}" "$*" >&2; }
die() {
  say "$*"
  exit 1
}

# wait_until SECONDS WHAT COMMAND...: runs COMMAND every half second until it succeeds, and
# dies ("WHAT: not within SECONDS s") if it has not when SECONDS have passed. A script whose
# failures say more (e2e's `fail`, the cluster's log directory) defines its own `die`.
wait_until() {
  local seconds=$1 what=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "$what: not within ${seconds}s"
    sleep 0.5
  done
}

WASMLESS_CACHE=${WASMLESS_CACHE:-$HOME/.cache/wasmless}

# ---- Go tools -----------------------------------------------------------------------------
# The tools the tests run that come as Go modules and not as Debian packages, each at the
# version given here. Helm (scripts/check-helm.sh and e2e; no Debian package, and its
# binaries come from a host this machine does not reach), Prometheus with Kubernetes discovery (e2e; Debian's is
# built without it), metrics-server and CoreDNS (scripts/cluster.sh) share one Go module: their
# common dependencies (client-go and the Kubernetes API types, grpc, OpenTelemetry) resolve to
# one version each and compile once into Go's build cache, where a module each compiled them
# once per tool. Each is built when first asked for (helm_tool, prometheus_tool,
# metrics_server_tool, coredns_tool below); scripts/test.sh asks for all of them in the
# background while Rust compiles. Kubernetes and etcd keep modules of their own
# (scripts/cluster.sh): their versions are pinned to each other's, not to these tools'.
HELM_VERSION=v3.22.0
# Every Go tool's build, here and in scripts/cluster.sh: trimmed paths, and no DWARF made by
# the compiler, which the link's `-w` would drop anyway (etcd cold: 76 -> 71 CPU-seconds).
GO_BUILD_FLAGS=(-trimpath -gcflags=all=-dwarf=false)
PROMETHEUS_VERSION=v0.316.0 # Prometheus 3.x's module versioning
# The only metrics-server version the proxy serves whole, and the line its compatibility
# matrix gives for Kubernetes 1.34+.
METRICS_SERVER_VERSION=v0.9.0
# Its client-go and API types are the others' (v0.37.1), so it adds no second copy of them.
COREDNS_VERSION=v1.15.0
GO_TOOLS=$WASMLESS_CACHE/tools/go
# The module's own packages: CoreDNS's main package, which picks its plugins.
GO_TOOLS_SOURCES=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cluster

# go_tools_module: the shared module's directory, made (and its dependencies resolved) when
# the versions above change; its own packages are copied in when they change. Locked, so
# tools built at once in the background agree.
go_tools_module() {
  local wanted
  wanted=$(printf 'module wasmless.local/tools\n\ngo 1.26.7\n\nrequire (\n\thelm.sh/helm/v3 %s\n\tgithub.com/prometheus/prometheus %s\n\tsigs.k8s.io/metrics-server %s\n\tgithub.com/coredns/coredns %s\n)\n' \
    "$HELM_VERSION" "$PROMETHEUS_VERSION" "$METRICS_SERVER_VERSION" "$COREDNS_VERSION")
  mkdir -p "$GO_TOOLS"
  (
    flock 9 || exit 1
    if [[ $(cat "$GO_TOOLS/module/go.mod.wanted" 2>/dev/null) != "$wanted" ]]; then
      rm -rf "${GO_TOOLS:?}/module" "${GO_TOOLS:?}/bin"
      mkdir -p "$GO_TOOLS/module"
      printf '%s' "$wanted" >"$GO_TOOLS/module/go.mod"
    fi
    cmp -s "$GO_TOOLS_SOURCES/coredns/main.go" "$GO_TOOLS/module/coredns/main.go" ||
      install -D -m 0644 "$GO_TOOLS_SOURCES/coredns/main.go" "$GO_TOOLS/module/coredns/main.go"
    [[ -f $GO_TOOLS/module/go.mod.wanted ]] && exit 0
    cd "$GO_TOOLS/module" || exit 1
    # ./coredns: the plugins its main package imports, from the CoreDNS module required above.
    local get=(helm.sh/helm/v3/cmd/helm@"$HELM_VERSION" github.com/prometheus/prometheus/cmd/prometheus@"$PROMETHEUS_VERSION"
      sigs.k8s.io/metrics-server/cmd/metrics-server@"$METRICS_SERVER_VERSION" ./coredns)
    GOFLAGS=-mod=mod GOTOOLCHAIN=local go get "${get[@]}" >/dev/null 2>&1 || GOFLAGS=-mod=mod GOTOOLCHAIN=local go get "${get[@]}" >&2 || exit 1
    printf '%s' "$wanted" >go.mod.wanted
  ) 9>"$GO_TOOLS/lock" || return 1
  echo "$GO_TOOLS/module"
}

# go_tool NAME PACKAGE [GO BUILD FLAGS...]: prints the path of tool NAME, built from PACKAGE in
# the shared module with the flags given (static, trimmed, stripped), when it is missing or
# was built with other flags.
go_tool() {
  local name=$1 package=$2
  shift 2
  local module bin stamp
  module=$(go_tools_module) || return 1
  bin=$GO_TOOLS/bin/$name
  stamp="$package $*"
  # A package of the module's own is rebuilt when its source changes too.
  [[ $package == ./* ]] && stamp+=" $(cat "$module/$package"/*.go | sha256sum | cut -c1-16)"
  mkdir -p "$GO_TOOLS/bin"
  # One build of a tool at a time: a caller that finds it being built (scripts/test.sh
  # builds Helm in the background) waits for it, then finds it built.
  (
    flock 9 || exit 1
    [[ -x $bin && $(cat "$bin.stamp" 2>/dev/null) == "$stamp" ]] && exit 0
    say "building $name from the Go module proxy into $GO_TOOLS/bin (once)"
    (cd "$module" && CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local go build "${GO_BUILD_FLAGS[@]}" "$@" -o "$bin" "$package") >&2 || exit 1
    printf '%s' "$stamp" >"$bin.stamp"
  ) 9>"$bin.lock" || return 1
  echo "$bin"
}

# The tools, each with its own flags (its Makefile's).
# Helm's version, and the Kubernetes version `helm template` and `helm lint` assume without
# a cluster (that of its client-go, v0.37 -> 1.37; Go's default would be 1.20, which the
# chart's kubeVersion refuses).
helm_tool() {
  local flags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" pkg
  for pkg in lint/rules chartutil; do
    flags+=" -X helm.sh/helm/v3/pkg/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/$pkg.k8sVersionMinor=37"
  done
  go_tool helm helm.sh/helm/v3/cmd/helm -ldflags "$flags"
}

# Prometheus with Kubernetes service discovery: Debian's prometheus (2.42) is built without
# it ("field kubernetes_sd_configs not found"). The build tags leave out every other
# discovery plugin (one of them, Nomad's, has a dependency the proxy does not serve).
prometheus_tool() {
  go_tool prometheus github.com/prometheus/prometheus/cmd/prometheus \
    -tags remove_all_sd,enable_kubernetes_sd -ldflags "-s -w"
}

metrics_server_tool() {
  go_tool metrics-server sigs.k8s.io/metrics-server/cmd/metrics-server \
    -ldflags "-s -w -X k8s.io/client-go/pkg/version.gitVersion=$METRICS_SERVER_VERSION"
}

# CoreDNS with the plugins a cluster's DNS needs (scripts/cluster/coredns/main.go), and not
# the cloud providers' and the rest that its own binary compiles in.
coredns_tool() {
  go_tool coredns ./coredns -ldflags "-s -w"
}

# An OpenTelemetry Collector for the runtime's trace test (runtime/tests/traces): the OTLP
# receiver and the file exporter only (scripts/otelcol/main.go, what the collector builder
# would generate), in a module of its own: the collector's gRPC and OpenTelemetry versions
# move with it, and in the shared module above they would move Prometheus's and CoreDNS's.
OTELCOL_VERSION=v0.165.0 # the contrib file exporter's; the core modules are v1.71.0 with it
OTELCOL=$WASMLESS_CACHE/tools/otelcol
OTELCOL_SOURCES=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/otelcol

# otelcol_tool: prints the path of the collector, built when missing or when its version or
# main.go changed.
otelcol_tool() {
  local stamp bin=$OTELCOL/bin/otelcol
  stamp="$OTELCOL_VERSION $(sha256sum <"$OTELCOL_SOURCES/main.go" | cut -c1-16)"
  mkdir -p "$OTELCOL"
  (
    flock 9 || exit 1
    [[ -x $bin && $(cat "$bin.stamp" 2>/dev/null) == "$stamp" ]] && exit 0
    say "building the OpenTelemetry Collector from the Go module proxy into $OTELCOL/bin (once)"
    rm -rf "${OTELCOL:?}/module"
    mkdir -p "$OTELCOL/module" "$OTELCOL/bin"
    cd "$OTELCOL/module" || exit 1
    cp "$OTELCOL_SOURCES/main.go" .
    printf 'module wasmless.local/otelcol\n\ngo 1.26.7\n\nrequire (\n\tgo.opentelemetry.io/collector/otelcol %s\n\tgo.opentelemetry.io/collector/receiver/otlpreceiver %s\n\tgithub.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter %s\n)\n' \
      "$OTELCOL_VERSION" "$OTELCOL_VERSION" "$OTELCOL_VERSION" >go.mod
    export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
    go get . >/dev/null 2>&1 || go get . >&2 || exit 1
    go build "${GO_BUILD_FLAGS[@]}" -ldflags "-s -w" -o "$bin" . >&2 || exit 1
    printf '%s' "$stamp" >"$bin.stamp"
  ) 9>"$OTELCOL/lock" || return 1
  echo "$bin"
}

# NATS with JetStream, the broker of events (events/, docs/plans/events.md): its tests start
# it on 127.0.0.1. Its own module, at the version given, as the collector above: its
# dependencies (nkeys, jwt, klauspost's compression) move with it.
NATS_SERVER_VERSION=v2.15.3
NATS_SERVER=$WASMLESS_CACHE/tools/nats-server

# nats_server_tool: prints the path of nats-server, built when missing or when its version
# changed.
nats_server_tool() {
  local bin=$NATS_SERVER/bin/nats-server
  mkdir -p "$NATS_SERVER"
  (
    flock 9 || exit 1
    [[ -x $bin && $(cat "$bin.stamp" 2>/dev/null) == "$NATS_SERVER_VERSION" ]] && exit 0
    say "building nats-server $NATS_SERVER_VERSION from the Go module proxy into $NATS_SERVER/bin (once)"
    rm -rf "${NATS_SERVER:?}/module"
    mkdir -p "$NATS_SERVER/module" "$NATS_SERVER/bin"
    cd "$NATS_SERVER/module" || exit 1
    printf 'module wasmless.local/nats\n\ngo 1.26.7\n\nrequire github.com/nats-io/nats-server/v2 %s\n' "$NATS_SERVER_VERSION" >go.mod
    export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
    go mod download github.com/nats-io/nats-server/v2 >/dev/null 2>&1 || go mod download github.com/nats-io/nats-server/v2 >&2 || exit 1
    go build "${GO_BUILD_FLAGS[@]}" -ldflags "-s -w" -o "$bin" github.com/nats-io/nats-server/v2 >&2 || exit 1
    printf '%s' "$NATS_SERVER_VERSION" >"$bin.stamp"
  ) 9>"$NATS_SERVER/lock" || return 1
  echo "$bin"
}
