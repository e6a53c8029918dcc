package xdsproxy

import (
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// What the control plane sent and what Envoy said of it (issue 22): a
// rejected version shows as NACKED with Envoy's error and the rejected
// version, each NACK is counted and logged once; a later version ACKed
// makes the type SYNCED again. The control plane (go-control-plane)
// answers each NACK with the rejected version again, which the client
// NACKs again, until v3: how many NACKs there were is known only then.
func TestNACKShownUntilALaterVersionIsACKed(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		cp, p, _ := clientAtV1(t, delta)
		st := p.waitState(t, "cds v1 ACKed", func(s messages.XDSState) bool { return s.Types[clusterType].ACKedVersion == "v1" })
		if v := st.Verdict(clusterType, st.Types[clusterType].SentAt, 0); v != messages.VerdictSynced {
			t.Fatalf("verdict %s after the ACK of v1; want SYNCED", v)
		}
		if st.Types[clusterType].SentResources != 2 {
			t.Errorf("sent resources %d; want 2", st.Types[clusterType].SentResources)
		}

		// v2 holds a cluster without a name: Envoy (the client) rejects it.
		listeners := []types.Resource{xdsserver.Listener("0.0.0.0_80", "80", false, 80)}
		if err := cp.SetSnapshot("v2", []types.Resource{&clusterv3.Cluster{}}, listeners, nil, nil, nil); err != nil {
			t.Fatal(err)
		}
		st = p.waitState(t, "the NACK of cds v2", func(s messages.XDSState) bool { return s.Types[clusterType].NACK != nil })
		n := st.Types[clusterType].NACK
		if n.Version != "v2" || !strings.Contains(n.Error, "has no name") || st.Types[clusterType].NACKs < 1 {
			t.Fatalf("NACK %+v (%d); want v2 with the client's error, counted", n, st.Types[clusterType].NACKs)
		}
		if v := st.Verdict(clusterType, n.At, 0); v != messages.VerdictNACKed {
			t.Fatalf("verdict %s; want NACKED", v)
		}

		snapshot(t, cp, "v3", 3)
		st = p.waitState(t, "cds v3 ACKed", func(s messages.XDSState) bool { return s.Types[clusterType].ACKedVersion == "v3" })
		if v := st.Verdict(clusterType, st.Types[clusterType].SentAt, 0); v != messages.VerdictSynced || st.Types[clusterType].NACK != nil {
			t.Fatalf("verdict %s, NACK %+v after v3 was ACKed; want SYNCED and no NACK", v, st.Types[clusterType].NACK)
		}
		nacks := st.Types[clusterType].NACKs
		if got := p.metric(t, "xds_proxy_nacks_total", clusterType); got != float64(nacks) {
			t.Errorf("xds_proxy_nacks_total{cds} = %v; want %d, the NACKs the state counts", got, nacks)
		}
		if got := strings.Count(p.logs.String(), "Envoy rejected a configuration (NACK)"); got != nacks {
			t.Errorf("%d NACKs logged, want %d (each once):\n%s", got, nacks, p.logs)
		}
	})
}
