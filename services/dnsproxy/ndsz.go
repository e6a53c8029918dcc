package dnsproxy

import (
	"encoding/json"
	"net/http"
	"slices"

	"github.com/meshagent/meshagent/messages"
)

// ndszEntry is one host of /debug/ndsz: the NameInfo with the alt hosts
// the proxy generated for it, as Istio's agent shows them.
type ndszEntry struct {
	IPs       []string `json:"ips"`
	Registry  string   `json:"registry,omitempty"`
	Shortname string   `json:"shortname,omitempty"`
	Namespace string   `json:"namespace,omitempty"`
	AltHosts  []string `json:"altHosts,omitempty"`
}

type ndsz struct {
	Version string               `json:"version"`
	Table   map[string]ndszEntry `json:"table"`
}

// NDSZ serves the table the DNS proxy answers from (as it publishes it on
// Outputs.Answering), with the alt hosts it generates, as JSON (Istio's GET
// :15020/debug/ndsz); 503 before the first table. It reads the channel,
// never the proxy: the tree hands it to the status server as a debug page
// (issue 34), which must keep it on localhost.
func NDSZ(answering messages.Latest[messages.DNSTable]) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		t, ok := answering.Get()
		if !ok {
			http.Error(w, notReadyReason, http.StatusServiceUnavailable)
			return
		}
		pd, pdParts := proxyDomain(t.Namespace, t.Domain)
		out := ndsz{Version: t.Table.Version, Table: make(map[string]ndszEntry, len(t.Table.Hosts))}
		for host, ni := range t.Table.Hosts {
			e := ndszEntry{Registry: ni.Registry, Shortname: ni.Shortname, Namespace: ni.Namespace}
			for _, ip := range ni.IPs {
				e.IPs = append(e.IPs, ip.String())
			}
			names := altHosts(nil, host, ni, t.Namespace, pd, pdParts)
			e.AltHosts = names[1:]
			slices.Sort(e.AltHosts)
			out.Table[host] = e
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
	})
}
