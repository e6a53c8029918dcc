package controlplane

import "github.com/meshagent/meshagent/messages/nds"

// Istio's registry names (pilot/pkg/serviceregistry/provider).
const (
	registryKubernetes = "Kubernetes"
	registryExternal   = "External"
)

// nameTable is the NDS table, in the shape istiod's BuildNameTable gives it
// (pkg/dns/server/name_table.go): a Kubernetes service is its FQDN with its
// VIP, registry, short name and namespace (from which the agent answers
// reviews, reviews.default, ...); an external name is only its host and
// addresses.
func nameTable(m Mesh) *nds.NameTable {
	t := &nds.NameTable{Table: map[string]*nds.NameTable_NameInfo{}}
	for _, s := range m.Services {
		vip, _ := s.VIP.ip() // checked by ParseMesh
		t.Table[s.FQDN(m.Domain)] = &nds.NameTable_NameInfo{
			Ips:       []string{vip.String()},
			Registry:  registryKubernetes,
			Shortname: s.Name,
			Namespace: s.Namespace,
		}
	}
	for _, e := range m.ExternalNames {
		ni := &nds.NameTable_NameInfo{Registry: registryExternal}
		for _, a := range e.IPs {
			ip, _ := a.ip()
			ni.Ips = append(ni.Ips, ip.String())
		}
		t.Table[e.Host] = ni
	}
	return t
}
