# docs/getting-started.md as a newcomer follows it: every ```sh block of the page run as
# written, in order, in one shell (e2e/page.py), checked against the output the page shows.
# Only what the run's set-up has done already is skipped, and the page says so where it is.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

GETTING_STARTED_NS=getting-started

getting_started() {
  step "docs/getting-started.md, run as written: wasmless dev, a first Function deployed from a folder, asked through its Service, then served from zero by the pool"
  [[ ! -e my-functions && ! -e dev.log ]] || fail "my-functions/ or dev.log is in the checkout already: the page makes them"
  # A newcomer's kubectl talks to the namespace of its context: a namespace of the page's own.
  kubectl create namespace "$GETTING_STARTED_NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  cp "$KUBECONFIG" "$WORK/getting-started.kubeconfig"
  KUBECONFIG=$WORK/getting-started.kubeconfig kubectl config set-context --current --namespace "$GETTING_STARTED_NS" >/dev/null
  python3 e2e/page.py script docs/getting-started.md >"$WORK/getting-started.sh" ||
    fail "docs/getting-started.md cannot be run as a newcomer reads it (above)"
  local status=0 done=$WORK/getting-started.done
  rm -f "$done"
  # In a process group of its own: what the page starts in the background (wasmless dev,
  # or dev.sh still building it) is stopped with it, were it to stop half-way.
  # scripts/dev.sh runs the test build's `wasmless` (WASMLESS_CLI) rather than building its own.
  KUBECONFIG=$WORK/getting-started.kubeconfig PAGE_DONE=$done \
    WASMLESS_CLI=${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}/release/wasmless \
    setsid bash "$WORK/getting-started.sh" &
  local page=$!
  wait "$page" || status=$?
  kill -- "-$page" 2>/dev/null || true
  rm -rf my-functions dev.log
  ((status == 0)) || fail "docs/getting-started.md does not run as written (above: the block, and what it printed)"
  [[ -s $done ]] || fail "docs/getting-started.md's script ended before its last block"
  kubectl delete namespace "$GETTING_STARTED_NS" --wait=false >/dev/null
  ok
}
