#!/usr/bin/env bash
# Builds the Goless sample handler to WebAssembly once, then serves it with
# wasmless-runtime on http://localhost:8080 (metrics on http://localhost:9090/metrics).
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}"

work="$CARGO_TARGET_DIR/sample"
mkdir -p "$work/handlers"
cp runtime/tests/handlers/goless-sample/handler.go "$work/handlers/handler.go"
cat >"$work/go.mod" <<GOMOD
module function

go 1.21

require wasmless.io/wasmless v0.0.0

replace wasmless.io/wasmless => $PWD/sdk/go
GOMOD
cat >"$work/main.go" <<'GO'
package main

import (
	"function/handlers"
	"wasmless.io/wasmless"
)

func main() { wasmless.ServeFunc(handlers.Handler) }
GO
echo "building the Goless sample (GOOS=wasip1)..." >&2
(cd "$work" && GOOS=wasip1 GOARCH=wasm GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local \
  go build -trimpath -ldflags=-s -o hello.wasm .)
sha256sum "$work/hello.wasm" | awk '{print "sha256:" $1}' >"$work/hello.wasm.sha256"

echo "building wasmless-runtime..." >&2
cargo build --release --quiet -p wasmless-runtime
echo "serving on http://localhost:8080 — try: curl localhost:8080" >&2
exec "$CARGO_TARGET_DIR/release/wasmless-runtime" --module "$work/hello.wasm" --function hello \
  --cache-dir "$work/cache" "$@"
