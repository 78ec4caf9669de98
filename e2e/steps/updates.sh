# Changing a Function that serves: a rolling update with no failed request, a compile error
# that keeps the old version, OCI storage, the operator's leader lost mid-build.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

# new_function NAME MESSAGE: applies a Go Function answering MESSAGE.
new_function() {
  local source
  source=$(go_handler "$2" | sed 's/^/    /')
  printf 'apiVersion: wasmless.io/v1alpha1\nkind: Function\nmetadata: {name: %s}\nspec:\n%s  source: |\n%s\n' \
    "$1" "${3:-}" "$source" | kubectl apply -n "$NS" -f - >/dev/null
}

rolling_update() {
  step "a source change: one new build, the running pod switched to it in place (read through the API), a rolling update, zero failed requests, old pods gone"
  local before url serving_pods started
  before=$(fn_field hello .status.moduleDigest)
  url=$(service_url hello)
  serving_pods=$(kubectl get pods -n "$NS" -l wasmless.io/function=hello,wasmless.io/component=runtime \
    --field-selector=status.phase=Running -o 'jsonpath={.items[*].metadata.name}')
  [[ -n $serving_pods ]] || fail "no running pod of hello before the change"
  # Requests through the Service, one connection each, for as long as the update runs.
  start_request_loop "$url" "$WORK/requests.log"
  started=$(date +%s.%N)
  set_source hello "$(go_handler 'v2')"
  module_changed() { [[ $(fn_field hello .status.moduleDigest) != "$before" ]]; }
  wait_until 600 "the new module" module_changed
  # The pod that served v1 has no volume of the new revision: its routes read its chunk
  # ConfigMaps through the API, as hello's chunk reader.
  local switched
  switched=$(pods_whose_routes_name "$serving_pods" "configmaps:hello/$(fn_field hello .status.sourceDigest)/")
  echo "pods switched in place: $switched of $(wc -w <<<"$serving_pods") ($serving_pods)"
  kubectl wait fn/hello -n "$NS" --for=condition=Ready --timeout=180s >/dev/null
  kubectl rollout status deploy/hello -n "$NS" --timeout=120s >/dev/null
  only_running_pods() { ! kubectl get pods -n "$NS" -l wasmless.io/function=hello,wasmless.io/component=runtime --no-headers | grep -v Running; }
  wait_until 120 "the old pods to go" only_running_pods
  sleep 2
  stop_request_loop "$WORK/requests.log"
  local total failed first
  read -r total failed first <<<"$(request_loop_figures "$WORK/requests.log" "$started" v2)"
  echo "$total requests during the update, $failed failed; v2 answered ${first} s after kubectl apply; last answer: $(tail -1 "$WORK/requests.log" | cut -d' ' -f2-)"
  expect_eq "$failed" 0 "failed requests during the rolling update"
  expect_eq "$(tail -1 "$WORK/requests.log" | cut -d' ' -f2-)" "ok v2" "the answer after the update"
  ((switched > 0)) || fail "the pod that served v1 was not switched to v2 in place (its routes do not read the new chunks through the API)"
  # One build for the new source; the old build's Job is collected once the new module serves.
  local source
  source=$(fn_field hello .status.sourceDigest)
  expect_eq "$(kubectl get jobs -n "$NS" -l "wasmless.io/function=hello" -o name)" "job.batch/hello-build-${source:7:10}" "build Jobs of hello after one change"
  expect_eq "$(kubectl get pods -n "$NS" -l wasmless.io/function=hello,wasmless.io/component=runtime --no-headers | wc -l)" 1 "runtime pods"
  ok
}

rollback() {
  step "revisions: after v2b, wasmless rollback sends hello back to v2 with no build and no failed request; then the latest again"
  local wasmless=${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}/release/wasmless url jobs before
  url=$(service_url hello)
  # A source no other step uses (failover's v3 must still need a build).
  set_source hello "$(go_handler 'v2b')"
  answers() { [[ $(get "$url" 2>/dev/null) == "$1" ]]; }
  wait_until 600 "hello to answer v2b" answers v2b
  kubectl wait fn/hello -n "$NS" --for=condition=Ready --timeout=180s >/dev/null
  local revisions
  revisions=$(fn_field hello '.status.revisions[*].name')
  echo "revisions: $revisions; latest ready: $(fn_field hello .status.latestReadyRevision)"
  read -r newest previous _ <<<"$revisions"
  [[ -n $previous ]] || fail "hello keeps fewer than two revisions: $revisions"
  jobs=$(kubectl get jobs -n "$NS" -l wasmless.io/function=hello --no-headers | wc -l)
  local serving_pods
  serving_pods=$(kubectl get pods -n "$NS" -l wasmless.io/function=hello,wasmless.io/component=runtime \
    --field-selector=status.phase=Running -o 'jsonpath={.items[*].metadata.name}')
  [[ -n $serving_pods ]] || fail "no running pod of hello before the rollback"
  start_request_loop "$url" "$WORK/rollback-requests.log"
  local started out
  started=$(date +%s.%N)
  out=$("$wasmless" rollback hello -n "$NS")
  echo "$out"
  expect_contains "$out" "all traffic on $previous (was $newest)" "wasmless rollback's answer"
  wait_until 60 "hello to answer v2 again" answers v2
  # In place: the pods that served v2b serve v2 now, by their routes annotation (the
  # revision before the one serving is mounted in every pod); no new pod rolls out.
  local switched
  switched=$(pods_whose_routes_name "$serving_pods" "\"$previous\"")
  echo "pods switched in place: $switched of $(wc -w <<<"$serving_pods") ($serving_pods)"
  ((switched > 0)) || fail "no pod that served $newest was switched to $previous in place"
  expect_eq "$(kubectl get fn hello -n "$NS" -o wide --no-headers | awk '{print $(NF)}')" "$previous" "kubectl get fn -o wide's SERVING column"
  expect_eq "$(kubectl get jobs -n "$NS" -l wasmless.io/function=hello --no-headers | wc -l)" "$jobs" "build Jobs after the rollback (none new)"
  # Back to the latest build, with v2's source: a new revision of what is kept, built by no one.
  local patch
  patch=$(python3 -c 'import json,sys; print(json.dumps([{"op": "replace", "path": "/spec/function", "value": sys.argv[1]}, {"op": "remove", "path": "/spec/traffic"}]))' "$(go_handler 'v2')")
  kubectl patch fn hello -n "$NS" --type json -p "$patch" >/dev/null
  latest_is_new() { [[ $(fn_field hello .status.latestReadyRevision) != "$newest" && $(fn_field hello .status.traffic[0].revision) == $(fn_field hello .status.latestReadyRevision) ]]; }
  wait_until 120 "a new latest revision serving v2" latest_is_new
  # (v2b's Job is collected now that v2's source is the latest again: fewer, never more.)
  local v2_source
  v2_source=$(fn_field hello .status.sourceDigest)
  expect_eq "$(kubectl get jobs -n "$NS" -l "wasmless.io/source-digest=${v2_source:7:10}" --no-headers 2>/dev/null | wc -l)" 0 "build Jobs of v2's source after going back to it (none)"
  sleep 1
  local total failed first_v2
  stop_request_loop "$WORK/rollback-requests.log"
  read -r total failed first_v2 <<<"$(request_loop_figures "$WORK/rollback-requests.log" "$started" v2)"
  echo "$total requests during the rollback and back, $failed failed; v2 answered ${first_v2} s after wasmless rollback started; revisions now: $(fn_field hello '.status.revisions[*].name')"
  expect_eq "$failed" 0 "failed requests during the rollback"
  expect_eq "$(get "$url")" "v2" "the answer after going back to the latest"
  ok
}

traffic_split() {
  step "a split: a new build takes 10% and its tag, 500 requests split within a few percent; promoted to 100%; wasmless rollback to the old one; no failed request throughout"
  local wasmless=${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}/release/wasmless url old patch
  url=$(service_url hello)
  old=$(fn_field hello .status.latestReadyRevision)
  expect_eq "$(get "$url")" "v2" "hello's answer before the split"
  start_request_loop "$url" "$WORK/split-requests.log"
  # The new source and the split in one edit, as a canary is rolled out: 90% stay on the
  # revision serving now, 10% (and every request tagged canary) go to the new build.
  patch=$(python3 -c 'import json,sys; print(json.dumps({"spec": {"function": sys.argv[1], "traffic": [{"revision": sys.argv[2], "percent": 90}, {"latestRevision": True, "percent": 10, "tag": "canary"}]}}))' "$(go_handler 'v4')" "$old")
  kubectl patch fn hello -n "$NS" --type merge -p "$patch" >/dev/null
  split_serves() { [[ $(fn_field hello .status.serving) == *"10% (canary)"* ]] && kubectl wait fn/hello -n "$NS" --for=condition=Ready --timeout=1s >/dev/null 2>&1; }
  wait_until 600 "the split to serve" split_serves
  local serving new
  serving=$(fn_field hello .status.serving)
  new=$(fn_field hello .status.latestReadyRevision)
  echo "serving: $serving"
  expect_eq "$serving" "$old 90%, $new 10% (canary)" "status.serving"
  expect_contains "$(kubectl get fn hello -n "$NS" -o wide --no-headers)" "$new 10% (canary)" "kubectl get fn -o wide"
  # Old pods may still be draining: the split is measured once only split pods answer.
  wait_until 60 "only the split's pods to answer" bash -c "[[ \$(curl -fsS -o /dev/null -w '%header{wasmless-revision}' '$url') == $old ]]"
  sleep 6
  local v2=0 v4=0 other=0 answer
  for _ in $(seq 500); do
    answer=$(get "$url") || fail "a request failed while measuring the split"
    case $answer in v2) v2=$((v2 + 1)) ;; v4) v4=$((v4 + 1)) ;; *) other=$((other + 1)) ;; esac
  done
  echo "500 requests through the Service: v2 (${old}) $v2, v4 (${new}) $v4, other $other"
  expect_eq "$other" 0 "answers from neither revision"
  ((v4 >= 35 && v4 <= 65)) || fail "the new revision took $v4 of 500 requests, not 10% within 3 points (35-65)"
  local tagged
  tagged=$(for _ in $(seq 20); do curl -fsS --max-time 5 -H 'Wasmless-Tag: canary' "$url"; echo; done | sort | uniq -c | xargs)
  expect_eq "$tagged" "20 v4" "20 requests tagged canary"
  expect_contains "$(curl -sS --max-time 5 -H 'Wasmless-Tag: nope' "$url")" "without that header" "an unknown tag's answer"

  # Promoted: all traffic on the new build.
  kubectl patch fn hello -n "$NS" --type merge -p '{"spec": {"traffic": [{"latestRevision": true, "percent": 100}]}}' >/dev/null
  promoted() { [[ $(fn_field hello .status.serving) == "$new" ]] && kubectl wait fn/hello -n "$NS" --for=condition=Ready --timeout=1s >/dev/null 2>&1; }
  wait_until 120 "the new revision to take all the traffic" promoted
  all_v4() { for _ in 1 2 3 4 5 6 7 8 9 10; do [[ $(get "$url" 2>/dev/null) == v4 ]] || return 1; done; }
  wait_until 30 "ten answers in a row from v4" all_v4

  # Rolled back to the revision before, by the CLI.
  local started out first_v2
  started=$(date +%s.%N)
  out=$("$wasmless" rollback hello -n "$NS")
  echo "$out"
  expect_contains "$out" "all traffic on $old (was $new)" "wasmless rollback's answer"
  answers_v2() { [[ $(get "$url" 2>/dev/null) == v2 ]]; }
  wait_until 60 "v2 after the rollback" answers_v2
  # Back to where later steps expect hello: v2's source, no traffic pinned.
  patch=$(python3 -c 'import json,sys; print(json.dumps([{"op": "replace", "path": "/spec/function", "value": sys.argv[1]}, {"op": "remove", "path": "/spec/traffic"}]))' "$(go_handler 'v2')")
  kubectl patch fn hello -n "$NS" --type json -p "$patch" >/dev/null
  latest_again() { [[ $(fn_field hello .status.latestReadyRevision) != "$new" && $(fn_field hello .status.serving) == $(fn_field hello .status.latestReadyRevision) ]]; }
  wait_until 120 "a new latest revision serving v2" latest_again
  sleep 1
  local total failed
  stop_request_loop "$WORK/split-requests.log"
  read -r total failed first_v2 <<<"$(request_loop_figures "$WORK/split-requests.log" "$started" v2)"
  echo "$total requests in the loop through the split, the promotion and the rollback, $failed failed; v2 answered the loop ${first_v2} s after wasmless rollback started"
  expect_eq "$failed" 0 "failed requests in the loop"
  expect_eq "$(get "$url")" "v2" "the answer after going back to the latest"
  ok
}

compile_error() {
  step "a compile error: phase Failed, the compiler's message on status and in an Event, v2 keeps answering"
  set_source hello "$(printf 'package handlers\n\nimport "net/http"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {\n\tundefinedHelper(w)\n}\n')"
  wait_until 600 "phase Failed" phase_is hello Failed
  local message
  message=$(fn_field hello .status.buildMessage)
  echo "buildMessage: $message"
  expect_contains "$message" "undefined: undefinedHelper" "status.buildMessage"
  local events
  events=$(kubectl get events -n "$NS" --field-selector involvedObject.name=hello -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}')
  expect_contains "$events" "undefined: undefinedHelper" "the BuildFailed Event"
  expect_eq "$(get_service hello)" "v2" "the previous version after a failed build"
  ok
}

oci_storage() {
  step "the Rust example with storage: oci: built, pushed to a registry, pulled by digest; an edit switches the running pods in place, no failed request; the registry keeps only kept revisions, and nothing once the Function is deleted"
  mkdir -p "$WORK/registry"
  # Deletes allowed, as the operator's garbage collection of revisions needs.
  printf 'version: 0.1\nlog: {level: warn}\nstorage: {filesystem: {rootdirectory: %s}, delete: {enabled: true}}\nhttp: {addr: "%s"}\n' \
    "$WORK/registry" "$REGISTRY" >"$WORK/registry.yml"
  docker-registry serve "$WORK/registry.yml" >"$WORK/registry.log" 2>&1 &
  PIDS+=($!)
  wait_until 30 "the registry" curl -fsS "http://$REGISTRY/v2/"
  # One revision kept: the edit's build cuts the first one, whose manifest must then go.
  sed 's/^  language: rust$/  language: rust\n  storage: oci\n  revisionHistoryLimit: 1/' examples/hello-rust/function.yaml | kubectl apply -n "$NS" -f - >/dev/null
  settled() { [[ $(fn_field hello-rust .status.phase) =~ ^(Ready|Failed)$ ]]; }
  wait_until 900 "hello-rust Ready or Failed" settled
  phase_is hello-rust Ready || fail "hello-rust: $(fn_field hello-rust .status.buildMessage)"
  expect_service_answer hello-rust "Hello from Rust!"
  local routes
  routes=$(kubectl get cm hello-rust-routes -n "$NS" -o 'jsonpath={.data.traffic\.json}')
  expect_contains "$routes" "oci://$REGISTRY/$NS/hello-rust@sha256:" "the module the runtime's routes name"
  local first_tag
  first_tag=$(fn_field hello-rust .status.sourceDigest)
  first_tag=${first_tag:7:10}
  expect_contains "$(registry_tags hello-rust)" "$first_tag" "the first build's tag in the registry"
  # An edit: the new build's module is pulled by digest (nothing to mount), so the running
  # pods switch to it in place as soon as it is built, while the rollout starts new ones.
  local url serving_pods started first_digest
  url=$(service_url hello-rust)
  first_digest=$(fn_field hello-rust .status.moduleDigest)
  serving_pods=$(kubectl get pods -n "$NS" -l wasmless.io/function=hello-rust,wasmless.io/component=runtime \
    --field-selector=status.phase=Running -o 'jsonpath={.items[*].metadata.name}')
  [[ -n $serving_pods ]] || fail "no running pod of hello-rust before the edit"
  start_request_loop "$url" "$WORK/oci-edit-requests.log"
  started=$(date +%s.%N)
  sed -e 's/^  language: rust$/  language: rust\n  storage: oci\n  revisionHistoryLimit: 1/' -e 's/Hello from Rust!\\n/rust-v2\\n/' \
    examples/hello-rust/function.yaml | kubectl apply -n "$NS" -f - >/dev/null
  answers() { [[ $(get "$url" 2>/dev/null) == "$1" ]]; }
  wait_until 600 "hello-rust to answer rust-v2" answers rust-v2
  edit_recorded() { [[ $(fn_field hello-rust .status.moduleDigest) != "$first_digest" ]]; }
  wait_until 60 "status to name the edit's module" edit_recorded
  # A pod that served the first build and whose routes name the edit's module was switched.
  local switched
  switched=$(pods_whose_routes_name "$serving_pods" "$(fn_field hello-rust .status.moduleDigest)")
  echo "pods switched in place: $switched of $(wc -w <<<"$serving_pods") ($serving_pods)"
  ((switched > 0)) || fail "no pod that served the first build was switched to the edit in place"
  sleep 1
  stop_request_loop "$WORK/oci-edit-requests.log"
  local total failed first
  read -r total failed first <<<"$(request_loop_figures "$WORK/oci-edit-requests.log" "$started" rust-v2)"
  echo "$total requests during the edit, $failed failed; rust-v2 answered ${first} s after kubectl apply; $(fn_field hello-rust '.status.conditions[?(@.type=="Built")].message')"
  expect_eq "$failed" 0 "failed requests during the edit"
  # Garbage: the first revision is no longer kept, so its manifest goes (a sweep every
  # 20 s, deleting what two sweeps in a row found stale); then, the Function deleted, all.
  local edit_tag
  edit_tag=$(fn_field hello-rust .status.sourceDigest)
  edit_tag=${edit_tag:7:10}
  only_the_edit() { [[ $(registry_tags hello-rust) == "$edit_tag" ]]; }
  wait_until 120 "the registry to hold only the kept revision's tag ($edit_tag)" only_the_edit
  kubectl delete fn hello-rust -n "$NS" --wait=true >/dev/null
  nothing_left() { [[ -z $(registry_tags hello-rust) ]]; }
  wait_until 120 "the deleted Function's manifests to go from the registry" nothing_left
  ok
}

# registry_tags FUNCTION: the tags of the Function's repository in the test's registry, one
# per line, sorted (none once its manifests are deleted).
registry_tags() {
  curl -fsS "http://$REGISTRY/v2/$NS/$1/tags/list" 2>/dev/null | python3 -c \
    'import json, sys; print("\n".join(sorted(json.load(sys.stdin).get("tags") or [])))' 2>/dev/null || true
}

failover() {
  step "the operator's leader deleted mid-build: it releases the Lease on SIGTERM, the other replica takes it at once and finishes the build, with no second Job"
  set_source hello "$(go_handler 'v3')"
  wait_until 60 "phase Building" phase_is hello Building
  local old_leader digest
  old_leader=$(leader)
  digest=$(fn_field hello .status.sourceDigest)
  # Every write of the Lease from here on, in order (holder|renewTime): the old leader's
  # renewals, its release (no holder), the new leader's acquisition. The first line is the
  # Lease as it is now; later writes are watched from that version on.
  kubectl get lease wasmless-operator -n wasmless-system --watch \
    -o 'jsonpath={.spec.holderIdentity}{"|"}{.spec.renewTime}{"\n"}' >"$WORK/lease.log" 2>&1 &
  PIDS+=($!)
  local watch=$!
  wait_until 10 "the watch of the Lease" test -s "$WORK/lease.log"
  local deleted=$SECONDS
  kubectl delete pod "$old_leader" -n wasmless-system --wait=false >/dev/null
  new_leader() {
    local holder
    holder=$(kubectl get lease wasmless-operator -n wasmless-system -o 'jsonpath={.spec.holderIdentity}')
    [[ -n $holder && $holder != "$old_leader" ]]
  }
  # Released, the Lease is taken at a standby's next try (every 5 s). Unreleased, it could be
  # taken only 15 s after its last renewal (every 5 s): 10 s after the delete at the earliest,
  # and then straight from the old holder, which the watch below would show.
  wait_until 10 "a new leader before the Lease could expire" new_leader
  echo "    new leader $(leader) $((SECONDS - deleted))s after deleting $old_leader"
  sleep 1 # the watch prints the acquisition
  kill "$watch" 2>/dev/null || true
  sed 's/^/    lease: /' "$WORK/lease.log"
  # The release itself: the holder emptied between the old leader and the new one.
  local released
  released=$(awk -F'|' -v old="$old_leader" '
    $1 == old && !cleared { seen_old = 1 }
    $1 == "" && seen_old { cleared = 1 }
    $1 != "" && $1 != old && cleared { print "yes"; exit }' "$WORK/lease.log")
  expect_eq "$released" yes "the Lease released (no holder) by $old_leader before another replica took it"
  local url
  url=$(service_url hello)
  answers_v3() { [[ $(get "$url") == v3 ]]; }
  wait_until 600 "v3 to answer" answers_v3
  local short=${digest#sha256:}
  short=${short:0:10}
  expect_eq "$(kubectl get jobs -n "$NS" -l "wasmless.io/source-digest=$short" -o name | wc -l)" 1 "Jobs for the v3 source"
  # The running pod answers v3 once switched in place, before the rollout that makes the
  # Function Ready is done.
  ready_after_failover() { phase_is hello Ready; }
  wait_until 120 "phase Ready after the failover (now $(fn_field hello .status.phase))" ready_after_failover
  ok
}

build_cache_hit() {
  step "the warm builder: hello's build reports its phases; the same source built again compiles and precompiles nothing"
  # The phases arrive with the builder's end, which can come just after the module is seen.
  has_phases() { [[ $(fn_field "$1" '.status.conditions[?(@.type=="Built")].message') == *"build phases:"* ]]; }
  wait_until 60 "hello's build phases on status" has_phases hello
  local message
  message=$(fn_field hello '.status.conditions[?(@.type=="Built")].message')
  echo "hello Built: $message"
  # hello-again has hello's source (v2) byte for byte: a build Job of its own (modules are
  # published per Function), whose builder finds the module and its code in the node's cache.
  python3 -c 'import json,sys; print(json.dumps({"apiVersion": "wasmless.io/v1alpha1", "kind": "Function",
    "metadata": {"name": "hello-again"}, "spec": {"function": sys.argv[1]}}))' "$(go_handler 'v2')" |
    kubectl apply -n "$NS" -f - >/dev/null
  expect_eq "$(fn_field hello-again .spec.function)" "$(fn_field hello .spec.function)" "hello-again's source"
  kubectl wait fn/hello-again -n "$NS" --for=condition=Ready --timeout=300s >/dev/null
  wait_until 60 "hello-again's build phases on status" has_phases hello-again
  message=$(fn_field hello-again '.status.conditions[?(@.type=="Built")].message')
  echo "hello-again Built: $message"
  expect_contains "$message" "module cache hit, code cache hit" "the second build of the same source"
  expect_contains "$message" "compile 0.00 s, snapshot 0.00 s" "what the cache hit compiled"
  # In the Built Event, or in BuildPhases when the builder ended after the module was seen;
  # the recorder posts Events after status is written, so they can trail it.
  hello_again_events() {
    kubectl get events -n "$NS" --field-selector involvedObject.name=hello-again \
      -o 'jsonpath={range .items[*]}{.reason}: {.message}{"\n"}{end}'
  }
  events_say_cache_hit() { [[ $(hello_again_events) == *"code cache hit"* ]]; }
  local deadline=$((SECONDS + 30))
  until events_say_cache_hit; do
    ((SECONDS < deadline)) ||
      fail "no Event of hello-again says 'code cache hit' within 30 s; its Events: $(hello_again_events | tr '\n' '|')"
    sleep 0.5
  done
  expect_contains "$(hello_again_events)" "code cache hit" "the Events of hello-again"
  expect_service_answer hello-again v2
  kubectl delete fn hello-again -n "$NS" --wait=false >/dev/null
  ok
}
