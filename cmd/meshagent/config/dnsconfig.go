package config

import (
	"github.com/meshagent/meshagent/services/dnsproxy"
)

// dnsSettings are the DNS proxy's config and the address other services
// need to know.
type dnsSettings struct {
	proxy *dnsproxy.Config // nil: the DNS proxy is off
	addr  string           // DNS_PROXY_ADDR
	// given is DNS_PROXY_ADDR as set ("" when unset): Istio's agent copies
	// it into Envoy's node metadata whether or not its DNS proxy runs.
	given string
}

// enabled says whether the DNS proxy runs.
func (d dnsSettings) enabled() bool { return d.proxy != nil }

// dnsConfig is the DNS proxy's config from Istio's variables: on with
// ISTIO_META_DNS_CAPTURE (sidecars only, as Istio) or
// ISTIO_META_ENABLE_DNS_SERVER, or when --name-table is given.
func dnsConfig(r envReader, f *ProxyFlags, pod podInfo, proxyType string) dnsSettings {
	capture := get(r, envIstioMetaDNSCapture)
	server := get(r, envIstioMetaEnableDNSServer)
	addr, given := lookup(r, envDNSProxyAddr)
	d := dnsSettings{addr: addr}
	if given {
		d.given = addr
	}
	cfg := &dnsproxy.Config{
		Listen:          d.addr,
		ResolvConf:      f.resolvConf,
		Namespace:       pod.namespace,
		Domain:          pod.domain,
		ForwardTimeout:  get(r, envDNSForwardTimeout),
		ForwardParallel: get(r, envDNSForwardParallel),
	}
	if capture && proxyType == "sidecar" || server || f.nameTable != "" {
		d.proxy = cfg
	}
	return d
}
