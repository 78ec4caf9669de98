// CoreDNS for the test cluster (scripts/cluster.sh): the cluster's DNS, with only the plugins
// its Corefile uses. Built by scripts/lib.sh's coredns_tool in the shared Go tools module,
// where client-go and the Kubernetes API types are compiled once for every tool.
//
// CoreDNS's own binary compiles in every plugin of its plugin.cfg (the cloud DNS providers
// with their SDKs among them); an outside main package that sets dnsserver.Directives is
// CoreDNS's documented way to build it with fewer.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The plugins in the order they handle a query: plugin.cfg's order, which the Corefile's
// order does not change.
var directives = []string{
	"bind",
	"ready",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"kubernetes",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
