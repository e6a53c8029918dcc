package certs

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
	meshca "github.com/meshagent/meshagent/services/ca"
	"github.com/meshagent/meshagent/testdata/testkit"
)

func TestFileMetrics(t *testing.T) {
	f := newFileSetup(t)
	reg := prometheus.NewRegistry()
	f.reg = reg
	f.startLoaded(t)
	if v := testkit.MetricValue(t, reg, "cert_expiry_seconds"); v < 3000 || v > 3600 {
		t.Errorf("cert_expiry_seconds = %v, want about 3600", v)
	}
	if v := testkit.MetricValue(t, reg, "num_file_secret_failures_total"); v != 0 {
		t.Errorf("num_file_secret_failures_total = %v before any failure", v)
	}
	testkit.WriteFile(t, filepath.Join(f.dir, KeyFileName), []byte("junk"))
	f.health.WaitState(t, messages.Degraded, "no PRIVATE KEY block")
	if v := testkit.MetricValue(t, reg, "num_file_secret_failures_total"); v < 1 {
		t.Errorf("num_file_secret_failures_total = %v after a bad key", v)
	}
}

func TestCAMetrics(t *testing.T) {
	c := newCASetup(t, time.Hour)
	reg := prometheus.NewRegistry()
	c.reg = reg
	testkit.WriteFile(t, c.cfg.TokenFile, []byte("wrong"))
	c.ca.Start(t)
	c.start(t)
	c.health.WaitState(t, messages.Starting, meshca.ErrUnauthenticated.Error())
	testkit.WriteFile(t, c.cfg.TokenFile, []byte(testToken))
	c.out.WaitLast(t, "certificate", func(b messages.CertBundle) bool { return b.Version != "" })
	sent, failed := testkit.MetricValue(t, reg, "num_outgoing_requests"), testkit.MetricValue(t, reg, "num_failed_outgoing_requests")
	if sent < 2 || failed < 1 || failed >= sent {
		t.Errorf("num_outgoing_requests=%v num_failed_outgoing_requests=%v; want ≥2 sent, ≥1 failed, fewer failed than sent", sent, failed)
	}
}
