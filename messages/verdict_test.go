package messages

import (
	"testing"
	"time"
)

// A type's verdict, as proxy-status prints it (issue 22).
func TestXDSVerdict(t *testing.T) {
	at := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	const cds = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	for _, tc := range []struct {
		name string
		st   XDSState
		now  time.Time
		want string
	}{
		{"nothing sent", XDSState{}, at, VerdictNotSent},
		{"acked", XDSState{Types: map[string]XDSTypeState{cds: {SentVersion: "v1", SentAt: at, ACKedVersion: "v1"}}}, at.Add(time.Hour), VerdictSynced},
		{"waiting, not yet stale", XDSState{Types: map[string]XDSTypeState{cds: {SentVersion: "v2", SentAt: at, ACKedVersion: "v1"}}}, at.Add(5 * time.Second), VerdictSynced},
		{"waiting too long", XDSState{Types: map[string]XDSTypeState{cds: {SentVersion: "v2", SentAt: at, ACKedVersion: "v1"}}}, at.Add(11 * time.Second), VerdictStale},
		{"nacked", XDSState{Types: map[string]XDSTypeState{cds: {SentVersion: "v2", SentAt: at, ACKedVersion: "v1", NACK: &XDSNack{Version: "v2"}}}}, at, VerdictNACKed},
		{"serving the cache", XDSState{Upstream: XDSServingCache, Types: map[string]XDSTypeState{cds: {SentVersion: "v1", SentAt: at, ACKedVersion: "v1"}}}, at, VerdictServingCache},
	} {
		if got := tc.st.Verdict(cds, tc.now, 10*time.Second); got != tc.want {
			t.Errorf("%s: verdict %s; want %s", tc.name, got, tc.want)
		}
	}
}
