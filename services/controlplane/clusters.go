package controlplane

import (
	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	httpopts "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// httpProtocolOptionsKey is where Envoy looks for a cluster's upstream HTTP
// protocol options.
const httpProtocolOptionsKey = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

// outboundClusters builds an EDS cluster per service port,
// outbound|<port>||<fqdn>, and the ClusterLoadAssignment it names.
func outboundClusters(m Mesh) (clusters, assignments []types.Resource) {
	for _, sp := range servicePorts(m) {
		name := sp.clusterName()
		c := &cluster.Cluster{
			Name:                 name,
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
			EdsClusterConfig:     &cluster.Cluster_EdsClusterConfig{EdsConfig: adsSource(), ServiceName: name},
			ConnectTimeout:       durationpb.New(connectTimeout),
			// Round robin rather than Istio's LEAST_REQUEST: grpc-go's
			// client, which reads the same clusters, supports it everywhere.
			LbPolicy: cluster.Cluster_ROUND_ROBIN,
		}
		if sp.port.Protocol.http2Upstream() {
			c.TypedExtensionProtocolOptions = map[string]*anypb.Any{
				httpProtocolOptionsKey: typed(&httpopts.HttpProtocolOptions{
					UpstreamProtocolOptions: &httpopts.HttpProtocolOptions_ExplicitHttpConfig_{
						ExplicitHttpConfig: &httpopts.HttpProtocolOptions_ExplicitHttpConfig{
							ProtocolConfig: &httpopts.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
								Http2ProtocolOptions: &core.Http2ProtocolOptions{},
							},
						},
					},
				}),
			}
		}
		clusters = append(clusters, c)
		assignments = append(assignments, loadAssignment(name, sp.port.Endpoints))
	}
	return clusters, assignments
}

// loadAssignment puts every endpoint in one locality, the empty one. grpc-go
// refuses a locality without an ID (even an empty one) and drops one
// without a weight; Envoy needs neither.
func loadAssignment(clusterName string, eps []Addr) *endpoint.ClusterLoadAssignment {
	cla := &endpoint.ClusterLoadAssignment{ClusterName: clusterName}
	if len(eps) == 0 {
		return cla
	}
	locality := &endpoint.LocalityLbEndpoints{
		Locality:            &core.Locality{},
		LoadBalancingWeight: wrapperspb.UInt32(uint32(len(eps))),
	}
	for _, e := range eps {
		ap, _ := e.ipPort() // checked by ParseMesh
		locality.LbEndpoints = append(locality.LbEndpoints, &endpoint.LbEndpoint{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: socketAddress(ap.Addr().String(), uint32(ap.Port())),
			}},
			HealthStatus:        core.HealthStatus_HEALTHY,
			LoadBalancingWeight: wrapperspb.UInt32(1),
		})
	}
	cla.Endpoints = []*endpoint.LocalityLbEndpoints{locality}
	return cla
}

// passthroughClusters are the clusters every sidecar has whatever the mesh:
// the original destination for unknown outbound traffic (the mesh's
// outboundTrafficPolicy ALLOW_ANY, Istio's default), a black hole for traffic
// sent to the capture port itself, and the original destination for inbound
// traffic, sent from 127.0.0.6 so that capture lets it through.
func passthroughClusters() []types.Resource {
	return []types.Resource{
		&cluster.Cluster{
			Name:                 passthroughCluster,
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_ORIGINAL_DST},
			LbPolicy:             cluster.Cluster_CLUSTER_PROVIDED,
			ConnectTimeout:       durationpb.New(connectTimeout),
		},
		&cluster.Cluster{
			Name:                 blackHoleCluster,
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC},
			ConnectTimeout:       durationpb.New(connectTimeout),
		},
		&cluster.Cluster{
			Name:                 inboundPassthrough,
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_ORIGINAL_DST},
			LbPolicy:             cluster.Cluster_CLUSTER_PROVIDED,
			ConnectTimeout:       durationpb.New(connectTimeout),
			UpstreamBindConfig: &core.BindConfig{SourceAddress: &core.SocketAddress{
				Address:       inboundPassthroughBindIP,
				PortSpecifier: &core.SocketAddress_PortValue{PortValue: 0},
			}},
		},
	}
}
