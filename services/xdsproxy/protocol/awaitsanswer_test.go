package protocol

import (
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// Which requests a control plane must answer: wildcard subscriptions that
// acknowledge nothing; never ACKs, never requests naming resources.
func TestAwaitsAnswer(t *testing.T) {
	s, d := SotW{}, Delta{}
	for _, tc := range []struct {
		req  *discoveryv3.DiscoveryRequest
		want bool
	}{
		{&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType}, true},
		{&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: "v1"}, true},
		{&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: "v1", ResponseNonce: "n"}, false},
		{&discoveryv3.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"a"}}, false},
		{&discoveryv3.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"*"}}, true},
	} {
		if got := s.AwaitsAnswer(tc.req); got != tc.want {
			t.Errorf("sotw %v: %v, want %v", tc.req, got, tc.want)
		}
	}
	for _, tc := range []struct {
		req  *discoveryv3.DeltaDiscoveryRequest
		want bool
	}{
		{&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType}, true},
		{&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: "n"}, false},
		{&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"a"}}, false},
	} {
		if got := d.AwaitsAnswer(tc.req); got != tc.want {
			t.Errorf("delta %v: %v, want %v", tc.req, got, tc.want)
		}
	}
}
