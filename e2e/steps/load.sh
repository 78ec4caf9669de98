# Zero failed requests under load (issue 40): wasmless-load sends ~1,000 requests a second
# through a Function's Service while it is edited, split, promoted, rolled back three times,
# its operator's leader deleted, scaled to zero and back and its pool's pod deleted, and
# reports each failure with its time, cause and change.
# WASMLESS_LOAD_HOLD=SECONDS holds each change that long under load (the long form: 120
# gives over a million requests); CI holds each for 5 s.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.
# Its helpers are named load_*: every step's functions (nested ones too, once their step
# ran) share one namespace, and other steps define their own settled().

# load_mark PHASE: the change the load loop's next requests fall in.
load_mark() {
  echo "$(date +%s.%N) $1" >>"$WORK/load-phases"
  echo "    $(date +%T) $1"
}

# load_hold: requests keep coming through what the last change left, for WASMLESS_LOAD_HOLD seconds.
load_hold() { sleep "${WASMLESS_LOAD_HOLD:-5}"; }

# load_settled FUNCTION: Ready, its rollout done, and no pod of it going away.
load_settled() {
  kubectl wait "fn/$1" -n "$NS" --for=condition=Ready --timeout=1s >/dev/null 2>&1 &&
    kubectl rollout status "deploy/$1" -n "$NS" --timeout=1s >/dev/null 2>&1 &&
    ! kubectl get pods -n "$NS" -l "wasmless.io/function=$1,wasmless.io/component=runtime" --no-headers | grep -v ' Running '
}

# load_answers_only URL BODY: ten answers in a row are BODY.
load_answers_only() {
  local _
  for _ in 1 2 3 4 5 6 7 8 9 10; do [[ $(get "$1" 2>/dev/null) == "$2" ]] || return 1; done
}

# load_revision_answering FUNCTION BODY: the kept revision whose source answers BODY (the
# step's handlers answer their own names).
load_revision_answering() {
  kubectl get fn "$1" -n "$NS" -o json | python3 -c '
import json, sys
fn, wanted = json.load(sys.stdin), sys.argv[1]
print(next(r["name"] for r in fn["status"]["revisions"] if r.get("sourceDigest") == wanted))' "$2"
}

# load_rollout_revision FUNCTION: its Deployment's rollout revision (a new ReplicaSet is a new one).
load_rollout_revision() {
  kubectl get deploy "$1" -n "$NS" -o 'jsonpath={.metadata.annotations.deployment\.kubernetes\.io/revision}'
}

# load_running_pods FUNCTION: its runtime pods that are not going away.
load_running_pods() {
  kubectl get pods -n "$NS" -l "wasmless.io/function=$1,wasmless.io/component=runtime" -o json |
    python3 -c 'import json, sys; print(" ".join(sorted(p["metadata"]["name"] for p in json.load(sys.stdin)["items"] if not p["metadata"].get("deletionTimestamp"))))'
}

# load_rollback_to URL ANSWER WHAT [REVISION]: `wasmless rollback`, as a phase, until only
# ANSWER comes: how long after the command ANSWER first came, and that no pod rolled.
load_rollback_to() {
  local bin=${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}/release
  local revision pods started first cli pod
  revision=$(load_rollout_revision steady)
  pods=$(load_running_pods steady)
  load_mark "wasmless rollback $3"
  started=$(date +%s.%N)
  "$bin/wasmless" rollback steady ${4:+"$4"} -n "$NS" >"$WORK/load-rollback.txt" 2>&1 &
  cli=$!
  until [[ $(get "$1" 2>/dev/null) == "$2" ]]; do
    python3 -c 'import sys, time; sys.exit(time.time() - float(sys.argv[1]) > 60)' "$started" ||
      fail "$2 did not answer within 60 s of wasmless rollback"
  done
  first=$(python3 -c 'import sys, time; print(f"{time.time() - float(sys.argv[1]):.2f}")' "$started")
  wait "$cli" || fail "wasmless rollback failed: $(cat "$WORK/load-rollback.txt")"
  sed 's/^/    /' "$WORK/load-rollback.txt"
  wait_until 60 "$2 alone to answer" load_answers_only "$1" "$2"
  echo "    $2 answered $first s after wasmless rollback started"
  echo "rollback $3: $first s" >>"$WORK/load-rollbacks"
  # No pod rolled: the same ReplicaSet, and every pod that served before serves on (the
  # autoscaler may have added one meanwhile).
  expect_eq "$(load_rollout_revision steady)" "$revision" "steady's rollout revision after the rollback (none rolled)"
  for pod in $pods; do
    [[ " $(load_running_pods steady) " == *" $pod "* ]] || fail "pod $pod went away in the rollback: a rollback rolls no pod"
  done
  load_hold
}

zero_failed_requests() {
  step "wasmless-load at ~1,000 requests/s through a new Function's edit, split, promotion, three rollbacks, its operator's leader deleted, scale 0 -> N -> 0 -> N and a pool pod deleted: no request fails"
  local bin=${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}/release
  local url patch s1 s2 rev1 rev2
  kubectl delete fn steady -n "$NS" --ignore-not-found --wait=true >/dev/null
  printf 'apiVersion: wasmless.io/v1alpha1\nkind: Function\nmetadata: {name: steady}\nspec:\n  function: |\n%s\n' \
    "$(go_handler s1 | sed 's/^/    /')" | kubectl apply -n "$NS" -f - >/dev/null
  wait_until 600 "steady to be Ready" load_settled steady
  url=$(service_url steady)
  wait_until 30 "steady to answer s1 through its Service" load_answers_only "$url" s1
  s1=$(fn_field steady .status.sourceDigest)
  rm -f "$WORK/load-phases" "$WORK/load-rollbacks"
  "$bin/wasmless-load" "$url" --rate 1000 --clients 8 --fresh-clients 4 --phases "$WORK/load-phases" \
    --output "$WORK/load.json" >"$WORK/load.txt" 2>&1 &
  PIDS+=($!)
  local loop=$!
  load_mark "serving s1"
  load_hold

  load_mark "edit to s2"
  set_source steady "$(go_handler s2)"
  wait_until 600 "s2 to answer" load_answers_only "$url" s2
  s2=$(fn_field steady .status.sourceDigest)
  rev2=$(load_revision_answering steady "$s2")
  load_hold

  load_mark "split 90% s2, 10% s3"
  patch=$(python3 -c 'import json,sys; print(json.dumps({"spec": {"function": sys.argv[1], "traffic": [{"revision": sys.argv[2], "percent": 90}, {"latestRevision": True, "percent": 10, "tag": "canary"}]}}))' "$(go_handler s3)" "$rev2")
  kubectl patch fn steady -n "$NS" --type merge -p "$patch" >/dev/null
  load_split_serves() { [[ $(fn_field steady .status.serving) == *"10% (canary)"* ]]; }
  wait_until 600 "the split to serve" load_split_serves
  load_hold

  load_mark "promotion of s3 to 100%"
  kubectl patch fn steady -n "$NS" --type merge -p '{"spec": {"traffic": [{"latestRevision": true, "percent": 100}]}}' >/dev/null
  wait_until 120 "s3 alone to answer" load_answers_only "$url" s3
  load_hold

  # Kept, newest first: s3, s2, s1. The standby (mounted in every pod) is the revision
  # before the one serving: s2 now; none while s1 (the oldest) serves; s1 while s2 serves.
  rev1=$(load_revision_answering steady "$s1")
  load_rollback_to "$url" s1 "to s1's revision, older than the standby" "$rev1"
  load_rollback_to "$url" s2 "to s2's revision (no standby while s1 serves)" "$rev2"
  load_rollback_to "$url" s1 "to the standby, s1"
  load_mark "the operator's leader deleted, then an edit to s4"
  wait_until 30 "a replica holding the operator's Lease" leader
  kubectl delete pod "$(leader)" -n wasmless-system --wait=false >/dev/null
  patch=$(python3 -c 'import json,sys; print(json.dumps([{"op": "replace", "path": "/spec/function", "value": sys.argv[1]}, {"op": "remove", "path": "/spec/traffic"}]))' "$(go_handler s4)")
  kubectl patch fn steady -n "$NS" --type json -p "$patch" >/dev/null
  wait_until 600 "s4 to answer" load_answers_only "$url" s4
  wait_until 180 "the edit's rollout" load_settled steady
  load_hold

  # Scale 0 -> N -> 0: a handler that takes 5 ms (at 1,000/s, 5 requests at once inside the
  # runtime, over a target of 2), free to go to zero pods after 15 s with little traffic.
  load_mark "edit to s5 (5 ms), scale.min 0, max 3"
  patch=$(python3 -c 'import json,sys; print(json.dumps({"spec": {"function": sys.argv[1], "scale": {"min": 0, "max": 3, "targetConcurrency": 2, "idleTimeout": "15s"}}}))' \
    "$(printf 'package handlers\n\nimport (\n\t"net/http"\n\t"time"\n)\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {\n\ttime.Sleep(5 * time.Millisecond)\n\tw.Write([]byte("s5"))\n}\n')")
  kubectl patch fn steady -n "$NS" --type merge -p "$patch" >/dev/null
  wait_until 600 "s5 to answer" load_answers_only "$url" s5
  load_hold
  load_mark "little traffic (rate=20): to zero pods, the pool serving"
  load_at_zero() { served_by_is steady pool && (($(own_pods steady) == 0)); }
  wait_until 180 "steady served by the pool with no pod of its own" load_at_zero
  load_hold
  load_mark "a pool pod deleted"
  kubectl delete pod -n "$NS" -l wasmless.io/component=pool --wait=false >/dev/null
  load_pool_ready() { (($(kubectl get pods -n "$NS" -l wasmless.io/component=pool --field-selector=status.phase=Running --no-headers | grep -c ' 1/1 ') >= 1)); }
  sleep 1
  wait_until 120 "a pool pod ready again" load_pool_ready
  sleep 10
  load_mark "traffic again (rate=1000): pods of its own"
  load_has_own_pods() { served_by_is steady pods && (($(ready_pods steady) >= 1)); }
  wait_until 180 "steady on pods of its own again" load_has_own_pods
  load_hold
  load_mark "end"
  sleep 1

  kill -TERM "$loop"
  wait "$loop" || fail "wasmless-load failed: $(cat "$WORK/load.txt")"
  sed 's/^/    /' "$WORK/load.txt"
  local requests failed rate
  # The rate while it was asked for in full: up to the slow handler's edit (the phases after
  # it are at rate=20, or 5 ms a request).
  read -r requests failed rate < <(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
full = [p for p in r["phases"] if p["phase"] != "(before)"]
full = full[:next(i for i, p in enumerate(full) if p["phase"].startswith("edit to s5"))]
print(r["requests"], r["failed"], round(sum(p["requests"] for p in full) / sum(p["seconds"] for p in full)))' "$WORK/load.json")
  ((rate >= 500)) || fail "the load loop sent $rate requests/s before the slow handler, too few to show anything (the machine is too busy?)"
  echo "    from wasmless rollback to the first answer of the revision asked for, no pod rolled:"
  sed 's/^/      /' "$WORK/load-rollbacks"
  expect_eq "$failed" 0 "failed requests of $requests"
  kubectl delete fn steady -n "$NS" --wait=false >/dev/null
  ok
}
