package dnsproxy

import (
	"encoding/json"
	"net/http"
	"slices"
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

// NDSZ serves the name table the proxy answers from, with the generated
// alt hosts, as JSON (Istio's GET :15020/debug/ndsz). 503 before the first
// table. The status server mounts it; it must stay on localhost.
func (s *Service) NDSZ() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		t := s.current.Load()
		if t == nil {
			http.Error(w, notReadyReason, http.StatusServiceUnavailable)
			return
		}
		pd, pdParts := proxyDomain(t.namespace, t.domain)
		out := ndsz{Version: t.version, Table: make(map[string]ndszEntry, len(t.source.Hosts))}
		for host, ni := range t.source.Hosts {
			e := ndszEntry{Registry: ni.Registry, Shortname: ni.Shortname, Namespace: ni.Namespace}
			for _, ip := range ni.IPs {
				e.IPs = append(e.IPs, ip.String())
			}
			names := altHosts(nil, host, ni, t.namespace, pd, pdParts)
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
