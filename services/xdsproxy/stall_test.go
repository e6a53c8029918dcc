package xdsproxy

import (
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

// Which requests a control plane must answer: wildcard subscriptions that
// acknowledge nothing; never ACKs, never requests naming resources.
func TestAwaitsAnswer(t *testing.T) {
	s, d := sotw{}, delta{}
	for _, tc := range []struct {
		req  *discoveryv3.DiscoveryRequest
		want bool
	}{
		{&discoveryv3.DiscoveryRequest{TypeUrl: clusterType}, true},
		{&discoveryv3.DiscoveryRequest{TypeUrl: clusterType, VersionInfo: "v1"}, true},
		{&discoveryv3.DiscoveryRequest{TypeUrl: clusterType, VersionInfo: "v1", ResponseNonce: "n"}, false},
		{&discoveryv3.DiscoveryRequest{TypeUrl: endpointType, ResourceNames: []string{"a"}}, false},
		{&discoveryv3.DiscoveryRequest{TypeUrl: endpointType, ResourceNames: []string{"*"}}, true},
	} {
		if got := s.awaitsAnswer(tc.req); got != tc.want {
			t.Errorf("sotw %v: %v, want %v", tc.req, got, tc.want)
		}
	}
	for _, tc := range []struct {
		req  *discoveryv3.DeltaDiscoveryRequest
		want bool
	}{
		{&discoveryv3.DeltaDiscoveryRequest{TypeUrl: clusterType}, true},
		{&discoveryv3.DeltaDiscoveryRequest{TypeUrl: clusterType, ResponseNonce: "n"}, false},
		{&discoveryv3.DeltaDiscoveryRequest{TypeUrl: endpointType, ResourceNamesSubscribe: []string{"a"}}, false},
	} {
		if got := d.awaitsAnswer(tc.req); got != tc.want {
			t.Errorf("delta %v: %v, want %v", tc.req, got, tc.want)
		}
	}
}
