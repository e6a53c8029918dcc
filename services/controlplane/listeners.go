package controlplane

import (
	"net"
	"strconv"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	originaldst "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_dst/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// sidecarListeners builds Istio's sidecar listeners:
//
//   - virtualOutbound on 0.0.0.0:15001, where capture sends outbound
//     traffic: Envoy hands each connection to the listener matching its
//     original destination, else passes it through;
//   - virtualInbound on 0.0.0.0:15006, where capture sends inbound traffic:
//     passed through to the application (no inbound policy here);
//   - 0.0.0.0_<port> for each HTTP port number in the mesh, shared by the
//     services using it and routed by Host through route configuration
//     "<port>";
//   - <vip>_<port> for each tcp service port, proxied to its cluster.
//
// Only the two capture listeners bind; the others receive the connections
// virtualOutbound hands over (bind_to_port false), as in Istio.
func sidecarListeners(m Mesh) []types.Resource {
	out := []types.Resource{virtualOutbound(), virtualInbound()}
	httpPorts := map[uint32]bool{}
	for _, sp := range servicePorts(m) {
		p := sp.port.Port
		if !sp.port.Protocol.isHTTP() {
			out = append(out, tcpListener(sp))
			continue
		}
		if httpPorts[p] {
			continue
		}
		httpPorts[p] = true
		name := "0.0.0.0_" + strconv.Itoa(int(p))
		out = append(out, &listener.Listener{
			Name:             name,
			Address:          socketAddress("0.0.0.0", p),
			BindToPort:       wrapperspb.Bool(false),
			TrafficDirection: core.TrafficDirection_OUTBOUND,
			FilterChains: []*listener.FilterChain{{
				Filters: []*listener.Filter{httpConnectionManager("outbound_"+name, routeNameForPort(p))},
			}},
		})
	}
	return out
}

func virtualOutbound() *listener.Listener {
	return &listener.Listener{
		Name:             virtualOutboundListener,
		Address:          socketAddress("0.0.0.0", outboundCapturePort),
		UseOriginalDst:   wrapperspb.Bool(true),
		TrafficDirection: core.TrafficDirection_OUTBOUND,
		FilterChains: []*listener.FilterChain{
			// A connection made to 15001 itself would pass through back to
			// 15001, for ever: Istio black-holes it.
			{
				Name:             "virtualOutbound-blackhole",
				FilterChainMatch: &listener.FilterChainMatch{DestinationPort: wrapperspb.UInt32(outboundCapturePort)},
				Filters:          []*listener.Filter{tcpProxy(blackHoleCluster, blackHoleCluster)},
			},
			{
				Name:    "virtualOutbound-catchall-tcp",
				Filters: []*listener.Filter{tcpProxy(passthroughCluster, passthroughCluster)},
			},
		},
	}
}

func virtualInbound() *listener.Listener {
	return &listener.Listener{
		Name:             virtualInboundListener,
		Address:          socketAddress("0.0.0.0", inboundCapturePort),
		TrafficDirection: core.TrafficDirection_INBOUND,
		ListenerFilters: []*listener.ListenerFilter{{
			Name:       wellknown.OriginalDestination,
			ConfigType: &listener.ListenerFilter_TypedConfig{TypedConfig: typed(&originaldst.OriginalDst{})},
		}},
		FilterChains: []*listener.FilterChain{
			{
				Name:             "virtualInbound-blackhole",
				FilterChainMatch: &listener.FilterChainMatch{DestinationPort: wrapperspb.UInt32(inboundCapturePort)},
				Filters:          []*listener.Filter{tcpProxy(blackHoleCluster, blackHoleCluster)},
			},
			{
				Name:    virtualInboundListener, // Istio's name for the TCP passthrough chain
				Filters: []*listener.Filter{tcpProxy(inboundPassthrough, inboundPassthrough)},
			},
		},
	}
}

// tcpListener matches the service's VIP and port: a tcp port has no Host
// header to route on, so each service needs its own listener.
func tcpListener(sp servicePort) *listener.Listener {
	return &listener.Listener{
		Name:             sp.vip.String() + "_" + strconv.Itoa(int(sp.port.Port)),
		Address:          socketAddress(sp.vip.String(), sp.port.Port),
		BindToPort:       wrapperspb.Bool(false),
		TrafficDirection: core.TrafficDirection_OUTBOUND,
		FilterChains: []*listener.FilterChain{{
			Filters: []*listener.Filter{tcpProxy(sp.clusterName(), sp.clusterName())},
		}},
	}
}

// proxylessListeners builds, for each grpc service port, the API listener
// a proxyless gRPC client asks for when dialing xds:///<fqdn>:<port>, named
// <fqdn>:<port>, with its route configuration named after the cluster, as
// istiod's grpc generator does (pilot/pkg/networking/grpcgen/lds.go).
func proxylessListeners(m Mesh) (listeners, routes []types.Resource) {
	for _, sp := range servicePorts(m) {
		if sp.port.Protocol != GRPC {
			continue
		}
		port := strconv.Itoa(int(sp.port.Port))
		manager := &hcm.HttpConnectionManager{
			StatPrefix: sp.clusterName(),
			RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
				ConfigSource:    adsSource(),
				RouteConfigName: sp.clusterName(),
			}},
			HttpFilters: []*hcm.HttpFilter{routerFilter()},
		}
		listeners = append(listeners, &listener.Listener{
			Name:        net.JoinHostPort(sp.fqdn, port),
			Address:     socketAddress(sp.vip.String(), sp.port.Port),
			ApiListener: &listener.ApiListener{ApiListener: typed(manager)},
		})
		routes = append(routes, proxylessRoute(sp))
	}
	return listeners, routes
}

func httpConnectionManager(statPrefix, routeName string) *listener.Filter {
	manager := &hcm.HttpConnectionManager{
		StatPrefix: statPrefix,
		CodecType:  hcm.HttpConnectionManager_AUTO,
		RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
			ConfigSource:    adsSource(),
			RouteConfigName: routeName,
		}},
		HttpFilters: []*hcm.HttpFilter{routerFilter()},
	}
	return &listener.Filter{
		Name:       wellknown.HTTPConnectionManager,
		ConfigType: &listener.Filter_TypedConfig{TypedConfig: typed(manager)},
	}
}

func routerFilter() *hcm.HttpFilter {
	return &hcm.HttpFilter{
		Name:       wellknown.Router,
		ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: typed(&router.Router{})},
	}
}

func tcpProxy(statPrefix, cluster string) *listener.Filter {
	return &listener.Filter{
		Name: wellknown.TCPProxy,
		ConfigType: &listener.Filter_TypedConfig{TypedConfig: typed(&tcpproxy.TcpProxy{
			StatPrefix:       statPrefix,
			ClusterSpecifier: &tcpproxy.TcpProxy_Cluster{Cluster: cluster},
		})},
	}
}
