package xdsproxy

import (
	"log/slog"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/xdsproxy/protocol"
	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// The fuzz targets of the proxy's parsers of outside input: responses
// from the control plane (scanned, never decoded, when forwarded; decoded
// for the agent's own types), and the cache file.

// agentResponses are responses of the agent's own types, both protocols.
func agentResponses(f *testing.F) [][]byte {
	nt, err := anypb.New(xdsserver.NameTable(map[string]string{"reviews.default.svc.cluster.local": "10.0.0.1", "v6.example": "2001:db8::1"}))
	if err != nil {
		f.Fatal(err)
	}
	pc, err := anypb.New(&meshconfig.ProxyConfig{CaCertificatesPem: []string{"not pem"}})
	if err != nil {
		f.Fatal(err)
	}
	var out [][]byte
	for _, m := range []proto.Message{
		&discoveryv3.DiscoveryResponse{VersionInfo: "1", TypeUrl: nameTableType, Nonce: "n", Resources: []*anypb.Any{nt}},
		&discoveryv3.DiscoveryResponse{VersionInfo: "2", TypeUrl: proxyConfigType, Nonce: "n", Resources: []*anypb.Any{pc}},
		&discoveryv3.DeltaDiscoveryResponse{SystemVersionInfo: "3", TypeUrl: nameTableType, Nonce: "n",
			Resources: []*discoveryv3.Resource{{Name: "nt", Version: "nt1", Resource: nt}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// FuzzAgentResponse feeds responses of the agent's own types (NDS,
// ProxyConfig) to the handler that consumes them, in both protocols: it
// never panics, and a name table it accepts is published, and kept in the
// cache so that it decodes again the same.
func FuzzAgentResponse(f *testing.F) {
	for _, b := range agentResponses(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		names := &lastNames{}
		s := &Service{cfg: Config{NDS: true, ProxyConfigXDS: true}, log: slog.New(slog.DiscardHandler),
			out: Outputs{Names: names, Anchors: messages.Discard[messages.TrustAnchors]{}}}
		fr := &rawxds.Frame{Body: rawxds.Body{b}}
		if fr.Scan() != nil {
			return // the codec refuses it before any handler
		}
		consumeAll(t, s, names, protocol.Delta{}.AgentResource, fr)
		consumeAll(t, s, names, protocol.SotW{}.AgentResource, fr)
	})
}

func consumeAll(t *testing.T, s *Service, names *lastNames, agentResource func(*rawxds.Frame) (*anypb.Any, string, error), fr *rawxds.Frame) {
	res, version, err := agentResource(fr)
	if err != nil {
		return
	}
	for _, typeURL := range []string{nameTableType, proxyConfigType} {
		names.set = false
		if err := s.consume(typeURL, res, version); err != nil || typeURL != nameTableType {
			continue
		}
		if !names.set {
			t.Fatal("a name table accepted and not published")
		}
		back, err := decodeNameTable(res.GetValue(), version)
		if err != nil || back.Version != names.last.Version || len(back.Hosts) != len(names.last.Hosts) {
			t.Fatalf("the accepted table does not decode again the same: %v", err)
		}
	}
}

// lastNames keeps the last table sent.
type lastNames struct {
	last messages.NameTable
	set  bool
}

func (l *lastNames) Send(nt messages.NameTable) { l.last, l.set = nt, true }
