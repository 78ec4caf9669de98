#!/usr/bin/env bash
# A crates registry on disk for the tests: the crates the Rust handlers under
# builder/tests/crates/ need (their Cargo.lock, the Rust SDK's dependencies included) and the
# tests' own crates under e2e/crates/ (packaged here, as `cargo publish` would), as a
# static sparse index (https://doc.rust-lang.org/cargo/reference/registry-index.html) —
# index/<prefix>/<name> files of JSON lines, with each .crate's sha256 as `cksum` and its
# dependencies and features read from the Cargo.toml inside it — and the .crate files in
# crates/<name>/<name>-<version>.crate. The tests serve it over HTTP on 127.0.0.1 and build
# through it with no network. The .crate files come from crates.io once (`cargo fetch` of
# the fixtures into a CARGO_HOME of its own), into
# $WASMLESS_CACHE/cargo-registry/<10 hex of the fixtures' Cargo.lock files>, so a change of
# the fixtures fills a new one. scripts/setup.sh runs it.
#   scripts/cargo-registry.sh [fill]        fill when missing, print the directory
#   scripts/cargo-registry.sh dir           print the directory only (empty when not filled)
#   scripts/cargo-registry.sh config URL    write index/config.json for the registry served
#                                           at URL (its index is URL/index/), for a static
#                                           server such as python3 -m http.server
# The index URL a build uses is then sparse+URL/index/.
set -euo pipefail
cd "$(dirname "$0")/.."
WASMLESS_CACHE=${WASMLESS_CACHE:-$HOME/.cache/wasmless}

fixtures=(builder/tests/crates/*/)
own_crates=(e2e/crates/*/)
key=$(cat builder/tests/crates/*/Cargo.lock e2e/crates/*/Cargo.toml e2e/crates/*/src/*.rs | sha256sum | cut -c1-10)
registry=$WASMLESS_CACHE/cargo-registry/$key

case ${1:-fill} in
  dir)
    [[ -f $registry/filled ]] && echo "$registry"
    exit 0
    ;;
  config)
    url=${2:?usage: scripts/cargo-registry.sh config URL}
    [[ -f $registry/filled ]] || { echo "not filled: run scripts/cargo-registry.sh first" >&2; exit 1; }
    printf '{"dl":"%s/crates/{crate}/{crate}-{version}.crate"}\n' "${url%/}" >"$registry/index/config.json"
    exit 0
    ;;
  fill) ;;
  *) echo "usage: scripts/cargo-registry.sh [fill|dir|config URL]" >&2; exit 2 ;;
esac

if [[ ! -f $registry/filled ]]; then
  mkdir -p "$registry"
  (
    flock 9
    [[ -f $registry/filled ]] && exit 0
    printf '[cargo-registry] downloading the test handlers'\'' crates into %s (once)\n' "$registry" >&2
    home=$registry/.cargo-home
    for dir in "${fixtures[@]}"; do
      # --locked: what crates.io serves is checked against the fixture's Cargo.lock.
      CARGO_HOME=$home cargo fetch --locked --quiet --manifest-path "$dir/Cargo.toml"
    done
    python3 - "$home" "$registry" "${own_crates[@]}" <<'PYTHON'
import gzip, hashlib, io, json, pathlib, sys, tarfile, tomllib

home, registry = map(pathlib.Path, sys.argv[1:3])
fetched = sorted(home.glob("registry/cache/*/*.crate"))
if not fetched:
    sys.exit("cargo fetch left no .crate files in " + str(home))

def package(directory):
    """A .crate of a directory's Cargo.toml and src/, as `cargo package` lays it out, with
    fixed times and owners so that its checksum is the same on every machine."""
    manifest = tomllib.loads((directory / "Cargo.toml").read_text())["package"]
    root = f"{manifest['name']}-{manifest['version']}"
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as zipped, tarfile.open(fileobj=zipped, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for path in [directory / "Cargo.toml", *sorted((directory / "src").rglob("*.rs"))]:
            data = path.read_bytes()
            info = tarfile.TarInfo(f"{root}/{path.relative_to(directory)}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()

crates = [path.read_bytes() for path in fetched] + [package(pathlib.Path(d)) for d in sys.argv[3:]]

def index_path(name):
    name = name.lower()
    if len(name) <= 2:
        return f"{len(name)}/{name}"
    if len(name) == 3:
        return f"3/{name[0]}/{name}"
    return f"{name[:2]}/{name[2:4]}/{name}"

def deps(table, kind, target=None):
    out = []
    for key, spec in (table or {}).items():
        if isinstance(spec, str):
            spec = {"version": spec}
        dep = {
            "name": key,
            "req": spec.get("version", "*"),
            "features": spec.get("features", []),
            "optional": spec.get("optional", False),
            "default_features": spec.get("default-features", spec.get("default_features", True)),
            "target": target,
            "kind": kind,
        }
        if "package" in spec:
            dep["package"] = spec["package"]
        out.append(dep)
    return out

lines = {}
for data in crates:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = next(m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/Cargo.toml"))
        manifest = tomllib.loads(tar.extractfile(member).read().decode())
    package = manifest["package"]
    name, version = package["name"], package["version"]
    entry_deps = []
    for section, kind in [("dependencies", "normal"), ("dev-dependencies", "dev"), ("build-dependencies", "build")]:
        entry_deps += deps(manifest.get(section), kind)
        for target, tables in manifest.get("target", {}).items():
            entry_deps += deps(tables.get(section), kind, target)
    features, features2 = {}, {}
    for feature, enables in manifest.get("features", {}).items():
        # As crates.io does: the newer syntax apart, for older cargo.
        new_syntax = any(e.startswith("dep:") or "?/" in e for e in enables)
        (features2 if new_syntax else features)[feature] = enables
    entry = {
        "name": name,
        "vers": version,
        "deps": entry_deps,
        "cksum": hashlib.sha256(data).hexdigest(),
        "features": features,
        "yanked": False,
        "links": package.get("links"),
    }
    if features2:
        entry["features2"] = features2
        entry["v"] = 2
    if "rust-version" in package:
        entry["rust_version"] = package["rust-version"]
    lines.setdefault(name, []).append(json.dumps(entry, separators=(",", ":")))
    target = registry / "crates" / name / f"{name}-{version}.crate"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)

for name, entries in lines.items():
    path = registry / "index" / index_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(sorted(entries)) + "\n")
print(f"[cargo-registry] {len(crates)} crates in {registry}", file=sys.stderr)
PYTHON
    rm -rf "$home"
    touch "$registry/filled"
  ) 9>"$WASMLESS_CACHE/cargo-registry/.lock-$key"
fi
echo "$registry"
