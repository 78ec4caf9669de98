#!/usr/bin/env bash
# A Go module proxy on disk for the tests: the modules the handlers under
# builder/tests/modules/ need, in the layout `go mod download` leaves in
# $GOMODCACHE/cache/download — which is the GOPROXY protocol as static files, so the tests
# serve it over HTTP on 127.0.0.1 and build through it with no network. Filled once from
# the machine's GOPROXY (proxy.golang.org by default) into
# $WASMLESS_CACHE/goproxy/<10 hex of the fixtures' go.sum files>, so a change of the
# fixtures fills a new one. Prints the directory to serve. scripts/setup.sh runs it.
#   scripts/goproxy.sh [fill]   fill when missing, print the directory
#   scripts/goproxy.sh dir      print the directory only (empty when not filled)
set -euo pipefail
cd "$(dirname "$0")/.."
WASMLESS_CACHE=${WASMLESS_CACHE:-$HOME/.cache/wasmless}

fixtures=(builder/tests/modules/*/)
key=$(cat builder/tests/modules/*/go.sum | sha256sum | cut -c1-10)
modcache=$WASMLESS_CACHE/goproxy/$key
served=$modcache/cache/download

if [[ ${1:-fill} == dir ]]; then
  [[ -f $modcache/filled ]] && echo "$served"
  exit 0
fi
if [[ ! -f $modcache/filled ]]; then
  mkdir -p "$modcache"
  (
    flock 9
    [[ -f $modcache/filled ]] && exit 0
    printf '[goproxy] downloading the test handlers'\'' modules into %s (once)\n' "$modcache" >&2
    for dir in "${fixtures[@]}"; do
      # -mod=readonly: the fixtures' go.sum is checked against what the proxy serves.
      (cd "$dir" && GOMODCACHE=$modcache GOFLAGS="-mod=readonly -modcacherw" GOTOOLCHAIN=local GOWORK=off go mod download)
    done
    touch "$modcache/filled"
  ) 9>"$WASMLESS_CACHE/goproxy/.lock-$key"
fi
echo "$served"
