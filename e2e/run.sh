#!/usr/bin/env bash
# End to end on the test cluster, as a user would: `kubectl apply`, `kubectl get fn`, curl
# through the Service, Prometheus discovering and scraping the function's pods.
#
#   scripts/cluster.sh up && scripts/build-images.sh | xargs scripts/cluster.sh load
#   e2e/run.sh [STEP...]
#
# Each step stops the run at its first failed check, prints what the cluster holds, and the
# summary line. Besides the cluster it starts, on the pod bridge's gateway address and on
# loopback only, Debian's docker-registry (for storage: oci) and prometheus; it stops them.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/cluster.sh env)"
SAY_AS=e2e
# shellcheck source=scripts/lib.sh
. scripts/lib.sh   # wait_until, and the Go tools (Prometheus, Helm)

NS=e2e-functions
GATEWAY=$WASMLESS_CLUSTER_GATEWAY
REGISTRY=$GATEWAY:5000
WORK=$(mktemp -d /tmp/wasmless-e2e.XXXXXX)
PIDS=()
passed=0
current=setup

# shellcheck source=e2e/lib.sh
. e2e/lib.sh
for steps_file in e2e/steps/*.sh; do
  # shellcheck source=/dev/null
  . "$steps_file"
done

# The steps, in order: each builds on what the ones before it left (hello, Prometheus, the
# registry). What the operator's real_api scenarios already show on this same cluster (a
# renamed Service, the garbage collection of a deleted Function's objects) is not here:
# these are what only the installed product shows (images, Jobs, kube-proxy, Prometheus,
# metrics-server and the HPA, Helm, the API server's RBAC and admission).
steps=(
  install_operator goless_sample new_pod_precompiled           # steps/install.sh
  getting_started                                              # steps/getting_started.sh
  cluster_dns                                                  # steps/dns.sh
  scale_and_autoscale autoscale_on_cpu                         # steps/scale.sh
  scale_to_zero pooled_secret                                  # steps/zero.sh
  node_store                                                   # steps/node_store.sh
  cli_deploy                                                   # steps/cli.sh
  events_delivered events_survive_kills events_on_schedule     # steps/events.sh
  least_privilege tenant_doors heavy_neighbour keepalive_to_deleted  # steps/security.sh
  call_another_function secret_rotation                       # steps/outbound.sh
  go_modules build_time_code                                   # steps/modules.sh
  go_as_written                                                # steps/handlers.sh
  files_beside                                                 # steps/handlers.sh
  prometheus_scrapes dashboard_queries                         # steps/prometheus.sh
  port_clash                                                   # steps/lifecycle.sh
  rolling_update build_cache_hit rollback traffic_split compile_error oci_storage failover  # steps/updates.sh
  zero_failed_requests                                         # steps/load.sh
  build_deadline delete_during_build                           # steps/lifecycle.sh
  apply_traced                                                 # steps/traces.sh
  namespaced_install                                           # steps/security.sh
  helm_install                                                 # steps/helm.sh
)
# Steps build on each other; naming some (`e2e/run.sh install_operator goless_sample`) runs only those.
for name in "${@:-${steps[@]}}"; do
  [[ " ${steps[*]} " == *" $name "* ]] || fail "no step $name; the steps are: ${steps[*]}"
  "$name"
done
