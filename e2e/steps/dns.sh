# The cluster's DNS (CoreDNS, which scripts/cluster.sh runs): Service names resolve from the
# node and from a pod, with the resolv.conf the kubelet writes, and nothing is forwarded out.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

DNS=$WASMLESS_CLUSTER_DNS

dns_a() { dig +short +time=2 +tries=1 @"$DNS" "$1" A; }
# dns_status NAME: the answer's status (NOERROR, NXDOMAIN, REFUSED, ...).
dns_status() { dig +time=2 +tries=1 @"$DNS" "$1" A | sed -n 's/.*status: \([A-Z]*\),.*/\1/p'; }

cluster_dns() {
  step "cluster DNS: Services by name from the node and from a pod, the pod's resolv.conf, no upstream"
  local ip host url
  ip=$(kubectl get svc hello -n "$NS" -o 'jsonpath={.spec.clusterIP}')
  url=$(fn_field hello .status.url)
  host=${url#http://}
  host=${host%%:*}
  expect_eq "$host" "hello.$NS.svc.cluster.local" "hello's status.url host"
  expect_eq "$(dns_a kubernetes.default.svc.cluster.local)" "$(kubectl get svc kubernetes -n default -o 'jsonpath={.spec.clusterIP}')" \
    "kubernetes.default.svc.cluster.local from the node"
  expect_eq "$(dns_a "$host")" "$ip" "$host from the node"
  expect_eq "$(dig +short +time=2 +tries=1 @"$DNS" -x "$ip")" "$host." "the PTR record of hello's ClusterIP"
  expect_eq "$(dns_status "nothing.$NS.svc.cluster.local")" NXDOMAIN "a Service that does not exist"
  expect_eq "$(dns_status example.com)" REFUSED "a name outside the cluster (there is no upstream)"

  # From a pod in the namespace, as a handler would: glibc's resolver with the resolv.conf the
  # kubelet wrote, the short name through the search path, and status.url over bash's
  # /dev/tcp. The builder image has the shell and getent the runtime's image has not.
  kubectl delete pod dns-probe -n "$NS" --ignore-not-found --wait=true >/dev/null
  kubectl run dns-probe -n "$NS" --image=wasmless/builder:0.1.0 --image-pull-policy=Never --restart=Never \
    --command -- bash -c "cat /etc/resolv.conf
echo \"short: \$(getent hosts hello)\"
echo \"fqdn: \$(getent hosts $host)\"
exec 3<>/dev/tcp/$host/${url##*:}
printf 'GET / HTTP/1.0\r\nHost: $host\r\n\r\n' >&3
echo \"body: \$(tail -n 1 <&3)\"" >/dev/null
  kubectl wait pod/dns-probe -n "$NS" --for=jsonpath='{.status.phase}'=Succeeded --timeout=90s >/dev/null ||
    fail "the DNS probe pod did not succeed: $(kubectl logs dns-probe -n "$NS" 2>&1)"
  local out
  out=$(kubectl logs dns-probe -n "$NS")
  sed 's/^/    /' <<<"$out"
  expect_contains "$out" "search $NS.svc.cluster.local svc.cluster.local cluster.local" "the pod's resolv.conf"
  expect_contains "$out" "nameserver $DNS" "the pod's resolv.conf"
  expect_contains "$out" "options ndots:5" "the pod's resolv.conf"
  expect_eq "$(sed -n 's/^short: \([^ ]*\).*/\1/p' <<<"$out")" "$ip" "hello (the short name) from a pod"
  expect_eq "$(sed -n 's/^fqdn: \([^ ]*\).*/\1/p' <<<"$out")" "$ip" "$host from a pod"
  expect_eq "$(sed -n 's/^body: //p' <<<"$out")" "This works!" "GET $url from a pod"
  kubectl delete pod dns-probe -n "$NS" --wait=false >/dev/null
  ok
}
