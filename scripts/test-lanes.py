#!/usr/bin/env python3
"""Runs the test binaries `cargo test` would run, in lanes beside each other.

    cargo test --release --workspace --no-run --message-format=json | scripts/test-lanes.py [--doc CMD...]

`cargo test` runs its binaries one after another, and each of the long ones (the runtime's,
the builder's, the operator's real_api scenarios) leaves the cores idle while it waits on
the test cluster, a build or a handler's deadline; side by side, one fills the other's
wait (13 minutes of binaries in 6.7 on a warm run; cold, the two cores were busy anyway).

Each binary runs as cargo runs it (in its package's directory, with CARGO, CARGO_MANIFEST_DIR
and CARGO_PKG_NAME/VERSION set) with its output kept apart and printed whole when it ends,
so nothing interleaves. Every binary runs even when one fails; the exit status is 1 if any
did, and the last lines list each binary's result and seconds.

WASMLESS_TEST_LANES (default 2, one a core) is how many run at once. The longest known
binaries go first, so the short ones fill in beside them. `--doc CMD...` adds one more job,
a command (the doc tests, which only cargo runs).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# Seconds each took in a cold run (docs/testing.md); unknown binaries count as short.
KNOWN = {"runtime": 234, "builder": 185, "operator": 96, "cli": 68}


class Job:
    def __init__(self, title, argv, cwd, env):
        self.title, self.argv, self.cwd, self.env = title, argv, cwd, env
        self.status = None
        self.seconds = 0.0
        self.index = 0

    def weight(self):
        return KNOWN.get(self.title.split()[0], 0)


def jobs_from_cargo(lines):
    """The test executables of a `cargo test --no-run --message-format=json` run."""
    cargo = os.environ.get("CARGO") or shutil.which("cargo") or "cargo"
    jobs = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        message = json.loads(line)
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message["profile"]["test"]:
            continue
        target = message["target"]
        package_dir = Path(message["manifest_path"]).parent
        # package_id: "path+file:///repo/runtime#wasmless-runtime@0.1.0" (or "#0.1.0" when
        # the directory is the package's name).
        tail = message["package_id"].rsplit("#", 1)[-1]
        name, _, version = tail.rpartition("@")
        name = name or package_dir.name
        env = dict(os.environ)
        env.update(
            CARGO=cargo,
            CARGO_MANIFEST_DIR=str(package_dir),
            CARGO_PKG_NAME=name,
            CARGO_PKG_VERSION=version,
        )
        source = os.path.relpath(target["src_path"], package_dir)
        jobs.append(Job(f"{target['name']} ({name}, {source})", [message["executable"]], package_dir, env))
    return jobs


def run(job, out_dir, lock):
    started = time.monotonic()
    log = Path(out_dir) / f"{job.index:02}-{job.title.split()[0]}.log"
    with open(log, "wb") as out:
        job.status = subprocess.call(job.argv, cwd=job.cwd, env=job.env, stdout=out, stderr=subprocess.STDOUT)
    job.seconds = time.monotonic() - started
    with lock:
        verdict = "ok" if job.status == 0 else f"FAILED (exit {job.status})"
        print(f"\n     Running {job.title}: {verdict} in {job.seconds:.0f} s", flush=True)
        sys.stdout.buffer.write(log.read_bytes())
        sys.stdout.flush()


def main():
    args = sys.argv[1:]
    jobs = jobs_from_cargo(sys.stdin)
    if not jobs:
        print("test-lanes: cargo listed no test binary", file=sys.stderr)
        return 1
    if args[:1] == ["--doc"]:
        jobs.append(Job("doc tests", args[1:], os.getcwd(), dict(os.environ)))
    jobs.sort(key=Job.weight, reverse=True)
    for index, job in enumerate(jobs):
        job.index = index
    lanes = max(1, int(os.environ.get("WASMLESS_TEST_LANES", "2")))
    # Kept after the run: a binary that hangs until CI's time runs out printed nothing yet.
    out_dir = tempfile.mkdtemp(prefix="wasmless-test-lanes.")
    print(f"test-lanes: {len(jobs)} test binaries, {lanes} at a time; each one's output, as it runs: {out_dir}", flush=True)
    queue = list(jobs)
    lock = threading.Lock()

    def lane():
        while True:
            with lock:
                if not queue:
                    return
                job = queue.pop(0)
            run(job, out_dir, lock)

    threads = [threading.Thread(target=lane) for _ in range(lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    print("\ntest-lanes: each binary's result and seconds")
    for job in sorted(jobs, key=lambda j: -j.seconds):
        print(f"{job.seconds:7.0f}  {'ok' if job.status == 0 else 'FAILED'}  {job.title}")
    failed = [job for job in jobs if job.status != 0]
    if failed:
        print(f"test-lanes: {len(failed)} of {len(jobs)} failed: " + ", ".join(j.title for j in failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
