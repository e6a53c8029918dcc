// Package envoyadmin is, for tests, the one decoder of Envoy's admin
// /config_dump: cmd/meshagent/envoyadmin, which `meshagent proxy-config`
// uses too (issue 22). These names keep the tests' imports short and
// stable; there is no second copy. The accessors below are the tests'
// alone.
package envoyadmin

import (
	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/cmd/meshagent/envoyadmin"
)

// Dump is a decoded /config_dump.
type Dump = envoyadmin.Dump

// Resolver resolves every type URL, unknown ones as empty messages.
var Resolver = envoyadmin.Resolver

// Decode reads a /config_dump body.
func Decode(body []byte) (*Dump, error) { return envoyadmin.Decode(body) }

// The accessors only tests read (issue 34: kept out of the agent).

// Marshal is protojson with the Resolver (the stand-in Envoy's
// /config_dump).
func Marshal(m proto.Message) ([]byte, error) {
	return protojson.MarshalOptions{Indent: "  ", Resolver: Resolver}.Marshal(m)
}

// Bootstrap is the bootstrap dump of d, nil if absent.
func Bootstrap(d *Dump) *adminv3.BootstrapConfigDump {
	for _, a := range d.GetConfigs() {
		m, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{Resolver: Resolver})
		if b, ok := m.(*adminv3.BootstrapConfigDump); err == nil && ok {
			return b
		}
	}
	return nil
}

// Names is, by xDS type URL (clusters, listeners, routes, endpoints), the
// names of the dynamic resources Envoy holds in d.
func Names(d *Dump) map[string][]string {
	out := map[string][]string{}
	add := func(typeURL string, a *anypb.Any) {
		m, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{Resolver: Resolver})
		if err != nil {
			return
		}
		if n, ok := m.(interface{ GetName() string }); ok && n.GetName() != "" {
			out[typeURL] = append(out[typeURL], n.GetName())
		} else if n, ok := m.(interface{ GetClusterName() string }); ok {
			out[typeURL] = append(out[typeURL], n.GetClusterName())
		}
	}
	for _, c := range d.Clusters().GetDynamicActiveClusters() {
		add("type.googleapis.com/envoy.config.cluster.v3.Cluster", c.GetCluster())
	}
	for _, l := range d.Listeners().GetDynamicListeners() {
		add("type.googleapis.com/envoy.config.listener.v3.Listener", l.GetActiveState().GetListener())
	}
	for _, r := range d.Routes().GetDynamicRouteConfigs() {
		add("type.googleapis.com/envoy.config.route.v3.RouteConfiguration", r.GetRouteConfig())
	}
	for _, e := range d.Endpoints().GetDynamicEndpointConfigs() {
		add("type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment", e.GetEndpointConfig())
	}
	return out
}

// Secret is the dynamic secret of d named name, nil if Envoy has none.
func Secret(d *Dump, name string) *tlsv3.Secret {
	for _, s := range d.Secrets().GetDynamicActiveSecrets() {
		if s.GetName() != name {
			continue
		}
		sec := &tlsv3.Secret{}
		if s.GetSecret().UnmarshalTo(sec) == nil {
			return sec
		}
	}
	return nil
}
