package status

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

// operatorFixture is a status server with every input an operator's page
// reads (tree, xDS, certificate, name table), at a frozen now.
type operatorFixture struct {
	*fixture
	certs *messages.Cell[messages.CertBundle]
	names *messages.Cell[messages.NameTable]
	xds   *messages.Cell[messages.XDSState]
}

func newOperatorFixture(t *testing.T, now time.Time) *operatorFixture {
	t.Helper()
	f := &operatorFixture{fixture: &fixture{
		health: messages.NewStream[messages.Health](0, nil), envoy: messages.NewCell[messages.EnvoyState](),
		tree: messages.NewCell[messages.TreeState](), ready: messages.NewCell[messages.Readiness](),
		drain: messages.NewStream[messages.Drain](0, nil), stop: messages.NewStream[messages.Shutdown](0, nil),
		chaos: messages.NewStream[messages.Chaos](0, nil), reg: prometheus.NewRegistry(),
	}, certs: messages.NewCell[messages.CertBundle](), names: messages.NewCell[messages.NameTable](), xds: messages.NewCell[messages.XDSState]()}
	svc, err := New(Config{Addr: "127.0.0.1:0"},
		Inputs{Health: f.health, Envoy: f.envoy, Tree: f.tree, XDS: f.xds, Certs: f.certs, Names: f.names, Metrics: f.reg},
		Outputs{Readiness: f.ready, Drain: f.drain, Shutdown: f.stop, Chaos: f.chaos},
		messages.NewRuntime(Name, f.health, testkit.FrozenClock{At: now}, f.reg, nil))
	if err != nil {
		t.Fatal(err)
	}
	f.svc = svc
	return f
}

// /debug/certs shows the workload certificate an operator asks about: its
// SPIFFE ID, serial, validity, the time left and the root's SHA-256
// fingerprint; /debug/names the name table's size, version and source;
// both loopback only, and "not reported" before the first value (issue 22).
func TestDebugCertsAndNames(t *testing.T) {
	now := time.Now().UTC().Truncate(time.Second)
	f := newOperatorFixture(t, now)
	svc, certs, names := f.svc, f.certs, f.names
	decode := func(path string, v any) {
		t.Helper()
		rec := treeRequest(svc, path, "127.0.0.1:1", nil)
		if rec.Code != http.StatusOK {
			t.Fatalf("GET %s = %d %s", path, rec.Code, rec.Body)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
			t.Fatalf("GET %s: %v\n%s", path, err, rec.Body)
		}
	}
	var c CertReport
	decode("/debug/certs", &c)
	if c.Reported {
		t.Errorf("before any certificate: %+v", c)
	}

	ca := pki.NewRoot(t, "root")
	chain, key := ca.Leaf(t, pki.Leaf{SPIFFE: pki.WorkloadID, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(3 * time.Hour)})
	certs.Send(messages.CertBundle{CertChainPEM: chain, KeyPEM: key, RootsPEM: ca.CertPEM, Version: "v1", RenewAt: now.Add(90 * time.Minute)})
	names.Send(messages.NameTable{Version: "file-abc", Hosts: map[string]messages.NameInfo{"a.example": {}, "b.example": {}}})

	decode("/debug/certs", &c)
	sum := sha256.Sum256(ca.Cert.Raw)
	wantFP := strings.ToUpper(fmt.Sprintf("%x", sum[:2]))
	leaf := pki.ParseLeaf(t, chain)
	if !c.Reported || len(c.SANs) != 1 || c.SANs[0] != pki.WorkloadID || c.Serial != leaf.SerialNumber.Text(16) ||
		c.RenewAt == nil || !c.RenewAt.Equal(now.Add(90*time.Minute)) ||
		!c.NotAfter.Equal(now.Add(3*time.Hour)) || !c.NotBefore.Equal(now.Add(-time.Hour)) || c.RemainingSeconds != 3*3600 ||
		len(c.RootSHA256) != 1 || !strings.HasPrefix(c.RootSHA256[0], wantFP[:2]+":"+wantFP[2:]+":") || len(c.RootSHA256[0]) != 32*3-1 {
		t.Errorf("/debug/certs: %+v (root starts %s)", c, wantFP)
	}
	if strings.Contains(treeRequest(svc, "/debug/certs", "127.0.0.1:1", nil).Body.String(), "PRIVATE") {
		t.Error("/debug/certs shows the private key")
	}
	var n NamesReport
	decode("/debug/names", &n)
	if !n.Reported || n.Names != 2 || n.Version != "file-abc" || n.Source != "file" {
		t.Errorf("/debug/names: %+v", n)
	}
	for _, path := range []string{"/debug/certs", "/debug/names"} {
		if rec := treeRequest(svc, path, "192.0.2.10:40000", nil); rec.Code != http.StatusForbidden {
			t.Errorf("remote GET %s = %d, want 403", path, rec.Code)
		}
	}
	// Without the inputs (no identity, no DNS) the pages are not served.
	plain := newFixture(Config{})
	if rec := treeRequest(plain.svc, "/debug/certs", "127.0.0.1:1", nil); rec.Code != http.StatusNotFound {
		t.Errorf("/debug/certs without a certificate input = %d, want 404", rec.Code)
	}
}
