#!/usr/bin/env bash
# Builds the three images from what this machine has, pulling nothing, as image archives
# under ~/.cache/wasmless/images/ (printed one per line), for `scripts/cluster.sh load`:
#
#   scripts/build-images.sh [--tag 0.1.0]
#
#   wasmless/runtime:TAG   FROM scratch: the release wasmless-runtime, the C library it links
#                          and the CA bundle
#   wasmless/operator:TAG  FROM scratch: the same for wasmless-operator
#   wasmless/node-agent:TAG  FROM scratch: the same for wasmless-node-agent
#   wasmless/events:TAG    FROM scratch: the same for wasmless-events (deploy/events/)
#   wasmless/nats:TAG      FROM scratch: nats-server as scripts/lib.sh builds it from its Go
#                          module (static), the broker of deploy/events/
#   wasmless/builder:TAG   a Debian 12 (bookworm) base from debootstrap with gcc (cargo links
#                          build scripts with it), the Go toolchain on this machine, the Rust
#                          toolchain with wasm32-wasip2, wasmless-builder (the SDKs are compiled
#                          into it), the Rust SDK's dependencies vendored (a build Job needs no
#                          network) and a seed of Go's cache (go_cache_seed, below).
#
# This is the layout Dockerfile.runtime, Dockerfile.operator and Dockerfile.builder describe
# for an environment with a container registry; here it is assembled from directories,
# because no base image can be pulled. The binaries come from the one release build the
# tests share (`cargo test --release --no-run`), so nothing is compiled again for the images;
# they are linked against glibc, which the images carry, not statically as the Dockerfiles'.
set -euo pipefail
cd "$(dirname "$0")/.."

tag=0.1.0
[[ ${1:-} == --tag ]] && tag=$2
CACHE=${WASMLESS_CACHE:-$HOME/.cache/wasmless}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
release=$CARGO_TARGET_DIR/release
out=$CACHE/images
mkdir -p "$out"

SAY_AS=images
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

for binary in wasmless-runtime wasmless-operator wasmless-node-agent wasmless-events wasmless-builder; do
  [[ -x $release/$binary ]] || { say "no $release/$binary: run cargo test --release --workspace --no-run first"; exit 1; }
done

# install_binary BINARY ROOTFS [--with-libraries]: the binary, stripped, in /usr/local/bin,
# and for a scratch image the shared libraries it loads (the C library, from this Debian
# system) at the paths it loads them from.
install_binary() {
  local binary=$1 rootfs=$2
  install -D -m 0555 "$binary" "$rootfs/usr/local/bin/${binary##*/}"
  strip "$rootfs/usr/local/bin/${binary##*/}"
  [[ ${3:-} == --with-libraries ]] || return 0
  local lib
  for lib in $(ldd "$binary" | grep -o '/[^ ]*'); do
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
  done
}

# The CA bundle (Debian's ca-certificates, as on this machine): the OCI client reads the
# system's roots, and fails to start without any, even for a plain-HTTP registry.
install_ca_bundle() {
  install -D -m 0444 /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/ca-certificates.crt"
}

# fresh ARCHIVE INPUTS...: whether ARCHIVE is newer than every input (then it is kept).
fresh() {
  local archive=$1 input
  shift
  [[ -f $archive ]] || return 1
  for input in "$@"; do [[ $input -nt $archive ]] && return 1; done
  return 0
}

# scratch_image NAME BINARY: BINARY (a path; else one of the release build's) alone.
scratch_image() {
  local name=$1 binary=$2
  [[ $binary == */* ]] || binary=$release/$binary
  local archive=$out/$name-$tag.tar
  if ! fresh "$archive" "$binary"; then
    local rootfs
    rootfs=$(mktemp -d)
    install_binary "$binary" "$rootfs" --with-libraries
    install_ca_bundle "$rootfs"
    mkdir -m 1777 "$rootfs/tmp"
    scripts/image-archive.sh "$rootfs" "wasmless/$name:$tag" "$archive" --user 65532:65532 -- \
      "/usr/local/bin/${binary##*/}" >&2
    rm -rf "$rootfs"
  fi
  echo "$archive"
}

# A minimal Debian with the C compiler and libc headers, made once and cached.
debian_base() {
  local base=$CACHE/images/debian-bookworm-gcc
  if [[ ! -f $base/.complete ]]; then
    command -v debootstrap >/dev/null || { say "debootstrap is needed (apt-get install debootstrap)"; exit 1; }
    say "debootstrap of Debian bookworm with gcc into $base (once; about 2 minutes)"
    rm -rf "$base"
    debootstrap --variant=minbase --include=gcc,libc6-dev bookworm "$base" http://deb.debian.org/debian >&2
    rm -rf "$base"/var/cache/apt/archives/*.deb "$base"/var/lib/apt/lists/* "$base"/usr/share/{doc,man,info,locale}
    touch "$base/.complete"
  fi
  echo "$base"
}

# The Go standard library as the builder compiles it, from one build of a sample handler:
# a build Job copies it into an empty GOCACHE (builder/src/toolchain/go_cache_seed.rs), so a
# node's or a namespace's first Go build compiles the handler, not the library. The
# builder's -overlay makes the library's cache keys its own, so only the builder can make
# it. Kept under ~/.cache/wasmless/images by a key over what decides those keys (this Go,
# the overlay, the SDK): the builder binary changes far more often than they do.
go_cache_seed() {
  local into=$1 key seed work
  key=$({ go version; cat builder/src/toolchain/go.rs builder/src/toolchain/go_overlay.rs scripts/go-cache-seed-handler.go
    find sdk/go -type f \( -name '*.go' -o -name go.mod \) | sort | xargs cat; } | sha256sum | cut -c1-16)
  seed=$out/go-build-seed-$key
  if [[ ! -d $seed ]]; then
    say "Go's standard library for the builder's cache seed (once per Go, overlay and SDK)"
    rm -rf "$out"/go-build-seed-*
    work=$(mktemp -d)
    env -u GOCACHE WASMLESS_BUILD_CACHE="$work/cache" WASMLESS_COMPILER_CACHES_IN_CACHE_DIR=true \
      "$release/wasmless-builder" build --language go --source scripts/go-cache-seed-handler.go --output "$work/handler.wasm" \
      --no-code --termination-log /dev/null >"$work/build.log" 2>&1 ||
      { cat "$work/build.log" >&2; say "the seed's sample handler does not build"; exit 1; }
    mv "$work/cache/go-build" "$seed.partial"
    mv "$seed.partial" "$seed"
    rm -rf "$work"
  fi
  cp -a "$seed" "$into"
}

builder_image() {
  local archive=$out/builder-$tag.tar
  local sysroot goroot
  sysroot=$(rustc --print sysroot)
  goroot=$(go env GOROOT)
  # The SDKs are compiled into wasmless-builder: the binary is the only input that changes
  # (the seed's inputs, go_overlay.rs and the SDK, are compiled into it too).
  if fresh "$archive" "$release/wasmless-builder" scripts/go-cache-seed-handler.go; then
    echo "$archive"
    return
  fi
  local base rootfs
  base=$(debian_base)
  rootfs=$(mktemp -d "$CACHE/images/.builder.XXXXXX")
  cp -a "$base/." "$rootfs/"
  rm -f "$rootfs/.complete"
  install_binary "$release/wasmless-builder" "$rootfs"   # Debian 12's C library, as on this machine
  install_ca_bundle "$rootfs"
  # Go, as installed on this machine.
  mkdir -p "$rootfs/usr/local/go"
  cp -a "$goroot/." "$rootfs/usr/local/go/"
  rm -rf "$rootfs/usr/local/go/"{test,doc,api}
  # Rust: the compiler, cargo, and the standard libraries for the host (build scripts)
  # and for wasm32-wasip2 (handlers); no docs, no rustup.
  local rust=$rootfs/usr/local/rust
  mkdir -p "$rust/bin" "$rust/lib/rustlib"
  cp -a "$sysroot/bin/rustc" "$sysroot/bin/cargo" "$rust/bin/"
  cp -a "$sysroot"/lib/*.so* "$rust/lib/"
  for target in x86_64-unknown-linux-gnu wasm32-wasip2 etc; do
    cp -a "$sysroot/lib/rustlib/$target" "$rust/lib/rustlib/"
  done
  # The SDKs are compiled into wasmless-builder; the Rust SDK's dependencies are vendored.
  mkdir -p "$rootfs/opt/wasmless"
  "$release/wasmless-builder" vendor "$rootfs/opt/wasmless/vendor" >&2
  go_cache_seed "$rootfs/opt/wasmless/go-build-seed"
  mkdir -p -m 1777 "$rootfs/work" "$rootfs/tmp"
  scripts/image-archive.sh "$rootfs" "wasmless/builder:$tag" "$archive" --user 65532:65532 --workdir /work \
    --env PATH=/usr/local/go/bin:/usr/local/rust/bin:/usr/local/bin:/usr/bin:/bin \
    --env GOFLAGS=-mod=mod --env GOPROXY=off --env GOTOOLCHAIN=local --env CARGO_NET_OFFLINE=true \
    --env WASMLESS_VENDOR_DIR=/opt/wasmless/vendor --env WASMLESS_GO_CACHE_SEED=/opt/wasmless/go-build-seed \
    --env HOME=/tmp -- /usr/local/bin/wasmless-builder >&2
  rm -rf "$rootfs"
  echo "$archive"
}

scratch_image runtime wasmless-runtime
scratch_image operator wasmless-operator
scratch_image node-agent wasmless-node-agent
scratch_image events wasmless-events
scratch_image nats "$(nats_server_tool)"
builder_image
