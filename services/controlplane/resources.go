package controlplane

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/messages/nds"
)

// NameTableType is the type URL of Istio's NDS name table
// (pilot/pkg/model: NameTableType), which the agent asks for on the same ADS
// stream as Envoy's resources.
const NameTableType = "type.googleapis.com/istio.networking.nds.v1.NameTable"

// NameTableResourceName is the name the table is served under: none. istiod
// sends it as one unnamed resource (pilot/pkg/xds/nds.go), and the agent
// subscribes with no names (pkg/istio-agent/xds_proxy.go).
const NameTableResourceName = ""

// Istio's names for the parts of a sidecar's configuration that do not come
// from a service (pilot/pkg/model/listener.go, pilot/pkg/networking/util).
const (
	virtualOutboundListener = "virtualOutbound"
	virtualInboundListener  = "virtualInbound"
	passthroughCluster      = "PassthroughCluster"
	blackHoleCluster        = "BlackHoleCluster"
	inboundPassthrough      = "InboundPassthroughCluster"
	// inboundPassthroughBindIP is the source address of inbound passthrough
	// connections, which the capture rules exclude so that Envoy does not
	// capture its own traffic to the application.
	inboundPassthroughBindIP = "127.0.0.6"
	outboundCapturePort      = 15001
	inboundCapturePort       = 15006
	connectTimeout           = 10 * time.Second
)

// Node groups: every node gets the snapshot of its group (see nodeGroup).
const (
	groupSidecar   = "sidecar"
	groupProxyless = "proxyless"
)

// generated is everything one version of the mesh file produces.
type generated struct {
	// sidecar is Envoy's configuration, as istiod builds it for a sidecar.
	sidecar map[resource.Type][]types.Resource
	// proxyless is what a proxyless gRPC client asks for: an API listener
	// per grpc port and a route configuration per such listener, with the
	// outbound clusters and their endpoints. Envoy must not get the API
	// listeners: it accepts them only in its bootstrap.
	proxyless map[resource.Type][]types.Resource
	nameTable *nds.NameTable
}

// generate builds the resources for a checked mesh.
func generate(m Mesh) generated {
	clusters, endpoints := outboundClusters(m)
	sidecarClusters := slices.Concat(clusters, passthroughClusters())
	grpcListeners, grpcRoutes := proxylessListeners(m)
	return generated{
		sidecar: map[resource.Type][]types.Resource{
			resource.ClusterType:  sidecarClusters,
			resource.EndpointType: endpoints,
			resource.ListenerType: sidecarListeners(m),
			resource.RouteType:    sidecarRoutes(m),
		},
		proxyless: map[resource.Type][]types.Resource{
			resource.ClusterType:  clusters,
			resource.EndpointType: endpoints,
			resource.ListenerType: grpcListeners,
			resource.RouteType:    grpcRoutes,
		},
		nameTable: nameTable(m),
	}
}

// servicePort is one port of one service: the unit most resources are made
// of.
type servicePort struct {
	svc  MeshService
	port MeshPort
	fqdn string
	vip  netip.Addr
}

// clusterName is Istio's outbound cluster name, outbound|<port>|<subset>|<host>.
func (sp servicePort) clusterName() string {
	return "outbound|" + strconv.Itoa(int(sp.port.Port)) + "||" + sp.fqdn
}

// servicePorts lists every port of every service, in file order, so that
// the generated resources are in a stable order.
func servicePorts(m Mesh) []servicePort {
	var out []servicePort
	for _, s := range m.Services {
		vip, _ := s.VIP.ip() // checked by ParseMesh
		for _, p := range s.Ports {
			out = append(out, servicePort{svc: s, port: p, fqdn: s.FQDN(m.Domain), vip: vip})
		}
	}
	return out
}

// adsSource is "on the ADS stream you came on": the only config source a
// sidecar (and grpc-go) uses.
func adsSource() *core.ConfigSource {
	return &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
	}
}

func socketAddress(ip string, port uint32) *core.Address {
	return &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
		Address:       ip,
		PortSpecifier: &core.SocketAddress_PortValue{PortValue: port},
	}}}
}

// typed packs an extension's config. Marshalling a well-formed generated
// message cannot fail; a failure is a bug in this package, hence the panic
// (which the tree recovers and reports with its stack).
func typed(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("controlplane: packing %T: %v", m, err))
	}
	return a
}
