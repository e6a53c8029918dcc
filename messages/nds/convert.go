// Package nds holds Istio's NDS name table message
// (istio.networking.nds.v1.NameTable) and its conversion to the agent's own
// messages.NameTable.
package nds

//go:generate protoc --go_out=. --go_opt=paths=source_relative nds.proto

import (
	"fmt"
	"net/netip"
	"sort"

	"github.com/meshagent/meshagent/messages"
)

// ToMessage converts a NameTable as istiod sends it into the agent's
// messages.NameTable, stamped with version. Every address must parse: a bad
// one is an error naming the host and the value, so that a broken table is
// rejected as a whole rather than half applied.
func ToMessage(t *NameTable, version string) (messages.NameTable, error) {
	out := messages.NameTable{Version: version, Hosts: make(map[string]messages.NameInfo, len(t.GetTable()))}
	// Sorted, so that the error for a table with several bad hosts is stable.
	hosts := make([]string, 0, len(t.GetTable()))
	for h := range t.GetTable() {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		ni := t.GetTable()[h]
		if h == "" {
			return messages.NameTable{}, fmt.Errorf("name table: empty host name")
		}
		ips := make([]netip.Addr, 0, len(ni.GetIps()))
		for _, s := range ni.GetIps() {
			ip, err := netip.ParseAddr(s)
			if err != nil {
				return messages.NameTable{}, fmt.Errorf("name table: host %q: bad IP %q: %w", h, s, err)
			}
			ips = append(ips, ip.Unmap())
		}
		out.Hosts[h] = messages.NameInfo{
			IPs:       ips,
			Registry:  ni.GetRegistry(),
			Shortname: ni.GetShortname(),
			Namespace: ni.GetNamespace(),
			AltHosts:  append([]string(nil), ni.GetAltHosts()...), //nolint:staticcheck // deprecated by Istio, still honoured
		}
	}
	return out, nil
}
