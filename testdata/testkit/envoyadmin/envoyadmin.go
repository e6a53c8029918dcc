// Package envoyadmin is, for tests, the one decoder of Envoy's admin
// /config_dump: cmd/meshagent/envoyadmin, which `meshagent proxy-config`
// uses too (issue 22). These names keep the tests' imports short and
// stable; there is no second copy. The accessors below are the tests'
// alone.
package envoyadmin

import (
	"bytes"
	"encoding/json"

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

// Marshal is protojson as Envoy's admin API writes it (the stand-in
// Envoy's /config_dump): the proto field names (dynamic_active_clusters,
// socket_address, version_info, last_updated), not protobuf JSON's
// camelCase, which a script written against the stand-in would then
// expect of Envoy (#35); with the Resolver. Decode reads both. Indented as
// Envoy indents (two spaces, ": ") by encoding/json: protojson's own
// spacing varies on purpose from build to build, which a script matching
// text would trip on.
func Marshal(m proto.Message) ([]byte, error) {
	js, err := protojson.MarshalOptions{Resolver: Resolver, UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, js, "", "  "); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
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

// RuntimeValue is key's final value in a /runtime body ("" when Envoy's
// runtime has no such key).
func RuntimeValue(body []byte, key string) (string, error) {
	var rt struct {
		Entries map[string]struct {
			FinalValue string `json:"final_value"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(body, &rt); err != nil {
		return "", err
	}
	return rt.Entries[key].FinalValue, nil
}
