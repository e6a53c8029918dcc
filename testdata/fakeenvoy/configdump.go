package main

// /config_dump in Envoy's own format, envoy.admin.v3.ConfigDump (issue 22):
// a "configs" list of typed dumps (bootstrap, clusters, endpoints with
// ?include_eds, listeners, routes, secrets) with each dynamic resource's
// version_info and last_updated, private keys redacted, ?resource= and
// ?mask= as Envoy answers them. Anything that reads it (the agent's
// operator commands, Istio's tools, our tests) reads what a real Envoy
// serves; the stand-in's own shape before was kinder than Envoy.

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/meshagent/meshagent/testdata/testkit/envoyadmin"
)

// redacted is what Envoy shows in place of a private key.
const redacted = "[redacted]"

// handleConfigDump serves GET /config_dump.
func (e *envoy) handleConfigDump(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	dumps := e.configDump(q.Has("include_eds"))
	var configs []proto.Message
	if res := q.Get("resource"); res != "" {
		// Envoy: the entries of the repeated field named res, each alone.
		for _, d := range dumps {
			configs = append(configs, entries(d, res)...)
		}
		if len(configs) == 0 {
			http.Error(w, fmt.Sprintf("no resource %q in the config dump", res), http.StatusNotFound)
			return
		}
	} else {
		configs = dumps
	}
	if m := q.Get("mask"); m != "" {
		for _, c := range configs {
			keepOnly(c.ProtoReflect(), strings.Split(m, ","))
		}
	}
	out := &adminv3.ConfigDump{}
	for _, c := range configs {
		a, err := anypb.New(c)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		out.Configs = append(out.Configs, a)
	}
	// Types the stand-in does not link in (an Istio filter's config) are
	// shown by their type URL alone: Envoy would show their fields.
	writeAdminProto(w, out)
}

// configDump is the dumps in Envoy's order.
func (e *envoy) configDump(includeEDS bool) []proto.Message {
	e.mu.Lock()
	defer e.mu.Unlock()
	x := e.xds
	started := timestamppb.New(e.started)
	static := e.boot.GetStaticResources()

	clusters := &adminv3.ClustersConfigDump{VersionInfo: x.versions[typeCluster]}
	for _, c := range static.GetClusters() {
		clusters.StaticClusters = append(clusters.StaticClusters,
			&adminv3.ClustersConfigDump_StaticCluster{Cluster: mustAny(c), LastUpdated: started})
	}
	// A CDS cluster is warming until its endpoints and secrets are in, at
	// start as later; an LDS listener only once the workers run (Envoy's
	// listener manager makes it active at once during init) (#24, sds.go).
	active := dynamicEntries(x, typeCluster, func(name string, d dynamicResource) *adminv3.ClustersConfigDump_DynamicCluster {
		dc := &adminv3.ClustersConfigDump_DynamicCluster{VersionInfo: d.version, Cluster: d.resource, LastUpdated: d.updated}
		if e.clusterWarmingLocked(name) {
			clusters.DynamicWarmingClusters = append(clusters.DynamicWarmingClusters, dc)
			return nil
		}
		return dc
	})
	clusters.DynamicActiveClusters = slices.DeleteFunc(active, func(c *adminv3.ClustersConfigDump_DynamicCluster) bool { return c == nil })

	listeners := &adminv3.ListenersConfigDump{VersionInfo: x.versions[typeListener]}
	for _, l := range static.GetListeners() {
		if e.removed[l.GetName()] {
			continue // it could not listen (finalInit)
		}
		listeners.StaticListeners = append(listeners.StaticListeners,
			&adminv3.ListenersConfigDump_StaticListener{Listener: mustAny(l), LastUpdated: started})
	}
	listeners.DynamicListeners = dynamicEntries(x, typeListener, func(name string, d dynamicResource) *adminv3.ListenersConfigDump_DynamicListener {
		state := &adminv3.ListenersConfigDump_DynamicListenerState{VersionInfo: d.version, Listener: d.resource, LastUpdated: d.updated}
		if x.live && e.listenerWarmingLocked(name) {
			return &adminv3.ListenersConfigDump_DynamicListener{Name: name, WarmingState: state}
		}
		return &adminv3.ListenersConfigDump_DynamicListener{Name: name, ActiveState: state}
	})

	routes := &adminv3.RoutesConfigDump{}
	routes.DynamicRouteConfigs = dynamicEntries(x, typeRoute, func(_ string, d dynamicResource) *adminv3.RoutesConfigDump_DynamicRouteConfig {
		return &adminv3.RoutesConfigDump_DynamicRouteConfig{VersionInfo: d.version, RouteConfig: d.resource, LastUpdated: d.updated}
	})

	secrets := &adminv3.SecretsConfigDump{}
	for _, s := range static.GetSecrets() {
		secrets.StaticSecrets = append(secrets.StaticSecrets, &adminv3.SecretsConfigDump_StaticSecret{
			Name: s.GetName(), Secret: mustAny(redactSecret(s)), LastUpdated: started})
	}
	held := e.received[typeSecret]
	for _, name := range slices.Sorted(maps.Keys(held)) {
		h := held[name]
		secrets.DynamicActiveSecrets = append(secrets.DynamicActiveSecrets, &adminv3.SecretsConfigDump_DynamicSecret{
			Name: name, VersionInfo: h.version, LastUpdated: timestamppb.New(h.updated), Secret: mustAny(redactSecret(h.msg)),
		})
	}

	dumps := []proto.Message{&adminv3.BootstrapConfigDump{Bootstrap: withUserAgent(e.boot), LastUpdated: started}, clusters}
	if includeEDS {
		endpoints := &adminv3.EndpointsConfigDump{}
		endpoints.DynamicEndpointConfigs = dynamicEntries(x, typeEndpoint, func(_ string, d dynamicResource) *adminv3.EndpointsConfigDump_DynamicEndpointConfig {
			return &adminv3.EndpointsConfigDump_DynamicEndpointConfig{VersionInfo: d.version, EndpointConfig: d.resource, LastUpdated: d.updated}
		})
		dumps = append(dumps, endpoints)
	}
	return append(dumps, listeners, &adminv3.ScopedRoutesConfigDump{}, routes, secrets)
}

// withUserAgent is the bootstrap as Envoy dumps it: its node with the
// user agent Envoy fills in (name and build version, whose metadata
// istioctl's bootstrap summary prints), the stand-in naming itself in the
// build label (#35).
func withUserAgent(b *bootstrapv3.Bootstrap) *bootstrapv3.Bootstrap {
	b = proto.Clone(b).(*bootstrapv3.Bootstrap)
	if b.Node == nil {
		b.Node = &corev3.Node{}
	}
	md, _ := structpb.NewStruct(map[string]any{"build.label": "fakeenvoy", "revision.status": "Clean",
		"build.type": "RELEASE", "ssl.version": "BoringSSL"})
	b.Node.UserAgentName = "envoy"
	b.Node.UserAgentVersionType = &corev3.Node_UserAgentBuildVersion{UserAgentBuildVersion: &corev3.BuildVersion{
		Version: &typev3.SemanticVersion{}, Metadata: md}}
	return b
}

// dynamicResource is what a dump's dynamic entry says of a resource held.
type dynamicResource struct {
	version  string
	resource *anypb.Any
	updated  *timestamppb.Timestamp
}

// dynamicEntries are the dump's entries for the resources of typeURL held,
// in name order, each made by entry from its name and dynamicResource: the
// one walk every type's dump shares, its entry type being its own.
func dynamicEntries[E any](x *xdsConfig, typeURL string, entry func(name string, d dynamicResource) E) []E {
	var out []E
	for _, name := range slices.Sorted(maps.Keys(x.resources[typeURL])) {
		out = append(out, entry(name, dynamicResource{
			version: x.versionOf(typeURL, name), resource: mustAny(x.resources[typeURL][name]),
			updated: timestamppb.New(x.updated[typeURL][name]),
		}))
	}
	return out
}

// versionOf is a resource's version: its own (Delta), else its type's
// (SotW).
func (x *xdsConfig) versionOf(typeURL, name string) string {
	if v, ok := x.resourceVersions[typeURL][name]; ok && v != "" {
		return v
	}
	return x.versions[typeURL]
}

// redactSecret is a secret as Envoy dumps it: private keys replaced.
func redactSecret(m proto.Message) proto.Message {
	s, ok := m.(*tlsv3.Secret)
	if !ok {
		return m
	}
	s = proto.Clone(s).(*tlsv3.Secret)
	if c := s.GetTlsCertificate(); c != nil && c.GetPrivateKey() != nil {
		c.PrivateKey = &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: redacted}}
	}
	return s
}

// entries are the elements of m's repeated message field named field.
func entries(m proto.Message, field string) []proto.Message {
	fd := m.ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name(field))
	if fd == nil || !fd.IsList() || fd.Message() == nil {
		return nil
	}
	list := m.ProtoReflect().Get(fd).List()
	out := make([]proto.Message, 0, list.Len())
	for i := range list.Len() {
		out = append(out, list.Get(i).Message().Interface())
	}
	return out
}

// keepOnly clears every field of m not named by a path of the mask (paths
// such as "dynamic_active_clusters.cluster" reach into messages and lists).
func keepOnly(m protoreflect.Message, paths []string) {
	children := map[string][]string{}
	for _, p := range paths {
		head, rest, _ := strings.Cut(strings.TrimSpace(p), ".")
		if rest != "" {
			children[head] = append(children[head], rest)
		} else if _, ok := children[head]; !ok {
			children[head] = nil // the whole field
		}
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		sub, keep := children[string(fd.Name())]
		switch {
		case !keep:
			m.Clear(fd)
		case len(sub) == 0:
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				keepOnly(v.List().Get(i).Message(), sub)
			}
		case fd.Message() != nil && !fd.IsMap():
			if a, ok := v.Message().Interface().(*anypb.Any); ok {
				// Envoy masks what an Any holds, not the Any.
				inner, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{Resolver: envoyadmin.Resolver})
				if err != nil {
					break
				}
				keepOnly(inner.ProtoReflect(), sub)
				if b, err := proto.Marshal(inner); err == nil {
					a.Value = b
				}
				break
			}
			keepOnly(v.Message(), sub)
		}
		return true
	})
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err)
	}
	return a
}
