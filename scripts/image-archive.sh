#!/usr/bin/env bash
# Packs a root filesystem into a one-layer image archive (the `docker save` layout, which
# `ctr images import` and `buildah pull docker-archive:` read), without a container engine:
#
#   scripts/image-archive.sh ROOTFS NAME:TAG OUT.tar [--user U:G] [--workdir DIR]
#                            [--env K=V]... -- ENTRYPOINT [ARG]...
#
# The layer is reproducible: sorted entries, mtime 0, owner root, so the same files give
# the same image ID.
set -euo pipefail

usage() { echo "usage: $0 ROOTFS NAME:TAG OUT.tar [--user U:G] [--workdir DIR] [--env K=V]... -- ENTRYPOINT [ARG]..." >&2; exit 2; }
[[ $# -ge 3 ]] || usage
rootfs=$1 name=$2 out=$3
shift 3
user=65532:65532 workdir=/ env=()
while [[ $# -gt 0 && $1 != -- ]]; do
  case $1 in
    --user) user=$2; shift 2 ;;
    --workdir) workdir=$2; shift 2 ;;
    --env) env+=("$2"); shift 2 ;;
    *) usage ;;
  esac
done
[[ ${1:-} == -- ]] || usage
shift
[[ $# -ge 1 ]] || usage
[[ -d $rootfs ]] || { echo "$rootfs is not a directory" >&2; exit 1; }
[[ $name == *:* && $name != *:latest ]] || { echo "$name: give a fixed tag, not latest" >&2; exit 1; }

json_array() {
  python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"
}

work=$(mktemp -d "${out%/*}/.image-archive.XXXXXX" 2>/dev/null || mktemp -d)
trap 'rm -rf "$work"' EXIT
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$rootfs" -cf "$work/layer.tar" .
layer_digest=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
cat >"$work/config.json" <<EOF
{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z",
 "config":{"User":"$user","WorkingDir":"$workdir","Env":$(json_array "${env[@]}"),"Entrypoint":$(json_array "$@")},
 "rootfs":{"type":"layers","diff_ids":["sha256:$layer_digest"]}}
EOF
config_digest=$(sha256sum "$work/config.json" | cut -d' ' -f1)
mv "$work/config.json" "$work/$config_digest.json"
mkdir "$work/$layer_digest"
mv "$work/layer.tar" "$work/$layer_digest/layer.tar"
cat >"$work/manifest.json" <<EOF
[{"Config":"$config_digest.json","RepoTags":["$name"],"Layers":["$layer_digest/layer.tar"]}]
EOF
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work" -cf "$out.partial" manifest.json "$config_digest.json" "$layer_digest"
mv "$out.partial" "$out"
echo "$out: $name (image sha256:$config_digest)"
