package xdsproxy

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// A trust-root rotation ends the upstream stream and the proxy dials again
// with the new roots, while Serve keeps running: Envoy's stream ends OK,
// Envoy reconnects and resynchronises, and the control plane, whose
// certificate now comes from the new root only, sees a second stream
// (#26: the tree no longer restarts the proxy's group for it). The first
// bundle, and a renewed leaf under the same roots, redial nothing.
func TestRootRotationRedialsWithoutRestart(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		rootA, rootB, server, cp := rotatingControlPlane(t, 1)
		upstreams := func() int {
			st := cp.Stats()
			return st.Streams + st.DeltaStreams
		}

		certs := messages.NewCell[messages.CertBundle]()
		cfg := bundleRootsConfig(t, cp.Addr())
		cfg.OfflineCache = false
		p := startProxy(t, cfg, proxyOpts{in: Inputs{Certs: certs}})
		certs.Send(rootBundle(t, rootA, "1")) // the first bundle: not a change
		certs.Send(rootBundle(t, rootA, "2")) // a renewal: the same roots

		c := p.client(t, delta)
		if err := c.WaitFor(waitCtx(t), hasVersion(resource.ClusterType, "v1", 1)); err != nil {
			t.Fatal(err)
		}
		if got := upstreams(); got != 1 {
			t.Fatalf("the control plane saw %d streams before the rotation, want 1", got)
		}

		server.Issue(t, rootB)
		certs.Send(rootBundle(t, rootB, "3"))
		if err := cp.WaitFor(waitCtx(t), func(s xdsserver.Stats) bool { return s.Streams+s.DeltaStreams == 2 }); err != nil {
			t.Fatalf("no new upstream stream with the new roots: %v (log: %s)", err, p.logs.String())
		}
		if err := c.WaitFor(waitCtx(t), func(s xdsserver.State) bool { return s.Streams == 2 }); err != nil {
			t.Fatal(err)
		}
		if end := c.State().Ends[0]; !errors.Is(end, io.EOF) {
			t.Errorf("Envoy's stream ended with %v, want an OK end (io.EOF to the client), as on an orderly upstream end", end)
		}
		// Envoy is in sync with the control plane through the new stream.
		snapshot(t, cp, "v2", 2)
		if err := c.WaitFor(waitCtx(t), hasVersion(resource.ClusterType, "v2", 2)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.serving.Done():
			t.Fatalf("Serve returned %v: the proxy was restarted, not redialled", p.serving.Err())
		default:
		}
		if got := strings.Count(p.logs.String(), `reason="trust roots changed"`); got != 1 {
			t.Errorf("%d log lines give the roots as a reason to redial, want 1 (the rotation; not the first bundle, not the renewal)", got)
		}
		if got := upstreams(); got != 2 {
			t.Errorf("the control plane saw %d streams, want 2", got)
		}
	})
}

// A proxy serving the cache because the control plane's certificate comes
// from a root it does not trust yet probes at once when new roots arrive
// (#26), without waiting for its backoff: the clock here never moves. The
// control plane answers, and Envoy's stream moves to it on the connection
// dialled with the new roots.
func TestNewRootsEndCacheServingAtOnce(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		rootA, rootB, server, cp := rotatingControlPlane(t, 3)
		certs := messages.NewCell[messages.CertBundle]()
		certs.Send(rootBundle(t, rootA, "1"))
		p := startProxy(t, bundleRootsConfig(t, cp.Addr()), proxyOpts{in: Inputs{Certs: certs}, clock: testkit.NewManualClock()})
		recordV1(t, p, cp, delta)

		server.Issue(t, rootB) // a certificate the proxy does not trust yet
		c := servedFromCache(t, p, delta)
		p.waitState(t, "serving the cache", func(s messages.XDSState) bool { return s.Upstream == messages.XDSServingCache })
		snapshot(t, cp, "v2", 5)
		certs.Send(rootBundle(t, rootB, "2"))
		continuesAfterCache(t, p, c, "v2", 5)
	})
}

// rotatingControlPlane is a TLS control plane at v1 (n clusters and
// listeners) serving istiod.istio-system.svc with a certificate from rootA,
// and rootB, the root a test rotates to (server.Issue(t, rootB)).
func rotatingControlPlane(t *testing.T, n int) (rootA, rootB *pki.CA, server *pki.ServerCert, cp *xdsserver.Server) {
	t.Helper()
	rootA, rootB = pki.NewRoot(t, "root-a"), pki.NewRoot(t, "root-b")
	server = pki.NewServerCert(t, rootA, "istiod.istio-system.svc")
	cp = controlPlane(t, xdsserver.Options{TLS: server.TLS()})
	snapshot(t, cp, "v1", n)
	return rootA, rootB, server, cp
}

// bundleRootsConfig is a TLS proxy for the control plane at addr that
// verifies it (as istiod.istio-system.svc) with the certificate bundle's
// roots.
func bundleRootsConfig(t *testing.T, addr string) Config {
	t.Helper()
	cfg := testConfig(tempRoot(t), addr)
	cfg.Plaintext = false
	cfg.Roots, cfg.ServerName = RootsCertBundle, "istiod.istio-system.svc"
	return cfg
}

// rootBundle is a bundle trusting ca alone, with a workload certificate
// from it.
func rootBundle(t *testing.T, ca *pki.CA, version string) messages.CertBundle {
	t.Helper()
	chain, key := ca.Workload(t, time.Hour)
	return messages.CertBundle{CertChainPEM: chain, KeyPEM: key, RootsPEM: ca.CertPEM, Version: version}
}
