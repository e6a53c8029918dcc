package xdsproxy

import (
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/messages/nds"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// The name table is requested on Envoy's first LDS request, published in
// order, NACKed when it does not parse (the last good table stays), and
// never forwarded to Envoy; the ProxyConfig's trust anchors likewise.
func TestNameTableAndProxyConfig(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		cp := servingControlPlane(t, "v1", 2)
		table := func(ip string) *nds.NameTable {
			return xdsserver.NameTable(map[string]string{"reviews.default.svc.cluster.local": ip})
		}
		if err := cp.SetNameTable(table("10.0.0.1")); err != nil {
			t.Fatal(err)
		}
		ca := pki.NewRoot(t, "extra-anchor")
		if err := cp.SetProxyConfig(&meshconfig.ProxyConfig{CaCertificatesPem: []string{string(ca.CertPEM)}}); err != nil {
			t.Fatal(err)
		}
		cfg := testConfig(tempRoot(t), cp.Addr())
		cfg.NDS, cfg.ProxyConfigXDS = true, true
		p := startProxy(t, cfg, proxyOpts{})
		c := p.client(t, delta)
		ctx := waitCtx(t)

		ip := func(nt messages.NameTable) string {
			ips := nt.Hosts["reviews.default.svc.cluster.local"].IPs
			if len(ips) != 1 {
				return ""
			}
			return ips[0].String()
		}
		p.names.WaitFor(t, "the first table", func(v []messages.NameTable) bool { return len(v) == 1 })
		anchors := p.anchors.WaitFor(t, "the trust anchors", func(v []messages.TrustAnchors) bool { return len(v) == 1 })
		if len(anchors[0].PEM) != 1 || string(anchors[0].PEM[0]) != string(ca.CertPEM) {
			t.Errorf("trust anchors = %q, want the ProxyConfig's certificate", anchors[0].PEM)
		}

		// In order: a table, a bad address, undecodable bytes, a table.
		if err := cp.SetNameTable(table("10.0.0.2")); err != nil {
			t.Fatal(err)
		}
		p.names.WaitFor(t, "the second table", func(v []messages.NameTable) bool { return len(v) == 2 })
		if err := cp.SetNameTable(table("not-an-ip")); err != nil {
			t.Fatal(err)
		}
		if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool { return s.NACKs[xdsserver.NameTableType] == 1 }); err != nil {
			t.Fatal(err)
		}
		testkit.Contains(t, "NACK of the bad table", cp.Stats().LastNACK[xdsserver.NameTableType], "not-an-ip")
		if err := cp.SetNameTable(&wrapperspb.BytesValue{Value: []byte{0xff, 0xff, 0xff}}); err != nil {
			t.Fatal(err)
		}
		if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool { return s.NACKs[xdsserver.NameTableType] == 2 }); err != nil {
			t.Fatal(err)
		}
		testkit.Contains(t, "NACK of undecodable bytes", cp.Stats().LastNACK[xdsserver.NameTableType], "decode name table")
		if err := cp.SetNameTable(table("10.0.0.3")); err != nil {
			t.Fatal(err)
		}
		got := p.names.WaitFor(t, "the third table", func(v []messages.NameTable) bool { return len(v) == 3 })
		for i, want := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
			if ip(got[i]) != want {
				t.Errorf("table %d maps reviews to %q, want %s (versions %q)", i, ip(got[i]), want, got[i].Version)
			}
		}
		if got[0].Version == got[2].Version {
			t.Errorf("tables 1 and 3 have the same version %q", got[0].Version)
		}
		if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool { return s.ACKs[xdsserver.NameTableType] == 3 }); err != nil {
			t.Fatal(err)
		}

		// Envoy saw its own types only.
		snapshot(t, cp, "v2", 1)
		if err := c.WaitFor(ctx, hasVersion(resource.ClusterType, "v2", 1)); err != nil {
			t.Fatal(err)
		}
		for typ := range c.State().Responses {
			if typ != resource.ClusterType && typ != resource.ListenerType {
				t.Errorf("Envoy received a response of type %s", typ)
			}
		}
		if st, _ := p.states.Get(); st.Upstream != messages.XDSConnected {
			t.Errorf("upstream state %v after NACKs, want connected", st.Upstream)
		}
	})
}

// An anchor that is not a certificate is NACKed and not published.
func TestProxyConfigBadAnchorNACKed(t *testing.T) {
	cp := servingControlPlane(t, "v1", 1)
	if err := cp.SetProxyConfig(&meshconfig.ProxyConfig{CaCertificatesPem: []string{"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}}); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(tempRoot(t), cp.Addr())
	cfg.ProxyConfigXDS = true
	p := startProxy(t, cfg, proxyOpts{})
	p.client(t, true)
	if err := cp.WaitFor(waitCtx(t), func(s xdsserver.Stats) bool { return s.NACKs[xdsserver.ProxyConfigType] == 1 }); err != nil {
		t.Fatal(err)
	}
	testkit.Contains(t, "NACK", cp.Stats().LastNACK[xdsserver.ProxyConfigType], "caCertificatesPem[0]")
	if got := p.anchors.All(); len(got) != 0 {
		t.Errorf("published %d anchors from a bad ProxyConfig", len(got))
	}
}

// VM health: each transition goes upstream as a HealthInformation request
// (after Envoy's first LDS request), an unhealthy one with the probe's
// message, and the last one again on every new stream.
func TestHealthTransitionsReported(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		cp := servingControlPlane(t, "v1", 1)
		cfg := testConfig(tempRoot(t), cp.Addr())
		cfg.HealthUpdates = true
		workload := messages.NewCell[messages.WorkloadHealth]()
		workload.Send(messages.WorkloadHealth{Healthy: true})
		p := startProxy(t, cfg, proxyOpts{in: Inputs{Workload: workload}})
		ctx := waitCtx(t)
		health := func(n int) []string {
			t.Helper()
			if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool { return len(s.Health) >= n }); err != nil {
				t.Fatal(err)
			}
			return cp.Stats().Health
		}

		c := p.client(t, delta)
		if got := health(1); got[0] != "" {
			t.Fatalf("first report %q, want healthy", got[0])
		}
		workload.Send(messages.WorkloadHealth{Healthy: false, Reason: "GET http://10.0.0.5:8080/ready: 503"})
		if got := health(2); got[1] != "GET http://10.0.0.5:8080/ready: 503" {
			t.Fatalf("second report %q, want the probe's message", got[1])
		}
		// Not a transition: nothing is sent. Then one that is.
		workload.Send(messages.WorkloadHealth{Healthy: false, Reason: "connection refused"})
		workload.Send(messages.WorkloadHealth{Healthy: true})
		if got := health(3); got[2] != "" || len(got) != 3 {
			t.Fatalf("reports %q, want the transition back to healthy third", got)
		}

		// A new stream resends the last report.
		c.Close()
		p.client(t, delta)
		if got := health(4); got[3] != "" {
			t.Fatalf("report on the new stream %q, want healthy", got[3])
		}
	})
}
