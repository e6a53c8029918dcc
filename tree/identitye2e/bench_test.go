package identitye2e

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/certs"
	"github.com/meshagent/meshagent/services/sds"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

// BenchmarkFileChangeToSDS: from the start of a certificate file rotation
// (tmp+rename, Istio's default 100ms debounce included) to the new secret
// arriving at the SDS client. Reports p50/p99 in ms and p99 over the
// debounce floor. Run with -benchtime=100x.
func BenchmarkFileChangeToSDS(b *testing.B) {
	a, issuer, dir := fileAgent(b)
	pairs := make([][2][]byte, 2)
	for i := range pairs {
		pairs[i][0], pairs[i][1] = issuer.Leaf(b, pki.Leaf{SPIFFE: e2eWorkloadID})
		a.keys = append(a.keys, pairs[i][1])
	}
	writeSet(b, a, dir, issuer, pairs[0][0], pairs[0][1])
	a.start(b)
	e := a.connect(b, sds.WorkloadKeyCertResourceName)
	e.next(b)
	rename := func(name string, data []byte) {
		tmp := filepath.Join(dir, "."+name+".tmp")
		testkit.WriteFile(b, tmp, data)
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p := pairs[(i+1)%2]
		start := time.Now()
		rename(certs.KeyFileName, p[1])
		rename(certs.CertChainFileName, p[0])
		for {
			s, _ := e.next(b)
			if chainOf(s) == string(p[0]) {
				break
			}
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	reportPercentiles(b, lat, a.certCfg.FileDebounce)
}

// BenchmarkBundleToSDS is the baseline: a CertBundle sent straight into
// the SDS server's input to the client receiving it (no files, no debounce).
func BenchmarkBundleToSDS(b *testing.B) {
	a := newAgent(b)
	a.certCfg = a.chooseSource(true) // files that never appear: certs stays quiet
	cell := a.bundles
	a.start(b)
	e := a.connect(b, sds.WorkloadKeyCertResourceName)
	a.keys = append(a.keys, []byte("k"))
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		v := messages.CertBundle{CertChainPEM: []byte{byte(i)}, KeyPEM: []byte("k"), RootsPEM: []byte("r"), Version: strconv.Itoa(i)}
		start := time.Now()
		cell.Send(v)
		e.next(b)
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	reportPercentiles(b, lat, 0)
}

func reportPercentiles(b *testing.B, lat []time.Duration, floor time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(float64(len(lat))*p))] }
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(pct(0.50)), "p50_ms")
	b.ReportMetric(ms(pct(0.99)), "p99_ms")
	if floor > 0 {
		b.ReportMetric(float64(pct(0.99))/float64(floor), "p99/debounce")
	}
}
