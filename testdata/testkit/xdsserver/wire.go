package xdsserver

import (
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Responses on the wire, for the tests of the XDS proxy's packages
// (xdsproxy, its raw codec and its cache), which read them undecoded.

// SotWResponse is an encoded DiscoveryResponse of n clusters (Clusters(n,
// "c-")).
func SotWResponse(t testing.TB, version, nonce string, n int) []byte {
	t.Helper()
	r := &discoveryv3.DiscoveryResponse{VersionInfo: version, TypeUrl: resource.ClusterType, Nonce: nonce}
	for _, c := range Clusters(n, "c-") {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		r.Resources = append(r.Resources, a)
	}
	b, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// DeltaResource is an encoded discovery.v3.Resource holding the cluster
// name, changed by mod if not nil.
func DeltaResource(t testing.TB, name, version string, mod func(*discoveryv3.Resource)) []byte {
	t.Helper()
	a, err := anypb.New(Cluster(name))
	if err != nil {
		t.Fatal(err)
	}
	r := &discoveryv3.Resource{Name: name, Version: version, Resource: a}
	if mod != nil {
		mod(r)
	}
	b, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Pieces splits b as gRPC hands a message over: in buffers of size bytes
// (16 KiB, HTTP/2's default frame size, from a control plane).
func Pieces(b []byte, size int) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		n := min(len(b), size)
		out = append(out, b[:n:n])
		b = b[n:]
	}
	return out
}
