package config

import (
	"net/netip"
	"slices"
	"strings"
)

// podInfo is the workload's identity and addresses.
type podInfo struct {
	name, namespace, serviceAccount string // POD_NAME, POD_NAMESPACE, SERVICE_ACCOUNT
	// nodeIPs are INSTANCE_IP's addresses, then the host's private ones;
	// the first is in Envoy's node id.
	nodeIPs []string
	// instanceIP is INSTANCE_IP's first address ("" when unset or bad):
	// where the application's probes go (Istio's PodIP).
	instanceIP string
	domain     string // --domain, else <namespace>.svc.cluster.local
}

// podConfig is the workload's identity from Istio's environment, and its
// IPs: INSTANCE_IP first, then the host's private addresses (Istio's
// getDNSDomain and IP discovery).
func podConfig(r envReader, f *ProxyFlags, host Host) podInfo {
	pod := podInfo{
		name:           get(r, envPodName),
		namespace:      get(r, envPodNamespace),
		serviceAccount: get(r, envServiceAccount),
		domain:         f.domain,
	}
	if pod.domain == "" {
		pod.domain = pod.namespace + ".svc.cluster.local"
	}
	if v := get(r, envInstanceIP); v != "" {
		for i, s := range strings.Split(v, ",") {
			ip, err := netip.ParseAddr(strings.TrimSpace(s))
			if err != nil {
				r.problems.addf("INSTANCE_IP=%s: %s is not an IP address", quoteValue(v), quoteValue(s))
				continue
			}
			if i == 0 {
				pod.instanceIP = ip.String()
			}
			pod.nodeIPs = append(pod.nodeIPs, ip.String())
		}
	}
	pod.nodeIPs = appendHostIPs(pod.nodeIPs, host, r.problems)
	return pod
}

// appendHostIPs adds the host's addresses not already in ips, as Istio's
// agent lists them (GetPrivateIPs, despite its name: every address but
// loopback, link-local and unspecified ones); with none, 127.0.0.1 and ::1.
func appendHostIPs(ips []string, host Host, p *Problems) []string {
	var found []string
	if host.InterfaceAddrs != nil {
		addrs, err := host.InterfaceAddrs()
		if err != nil {
			p.addf("listing the host's addresses: %v", err)
			return ips
		}
		for _, a := range addrs {
			ip := a.Addr().Unmap()
			if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() {
				continue
			}
			found = append(found, ip.String())
		}
	}
	if len(found) == 0 {
		found = []string{"127.0.0.1", "::1"}
	}
	for _, s := range found {
		if !slices.Contains(ips, s) {
			ips = append(ips, s)
		}
	}
	return ips
}
