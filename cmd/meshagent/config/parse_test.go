package config

import (
	"strings"
	"testing"
)

// A bad value is shown whole when short, else its start and end and its
// length: a 100 KB variable makes a short error (#21).
func TestQuoteValueCutsLongValues(t *testing.T) {
	if got := quoteValue("maybe"); got != `"maybe"` {
		t.Errorf("QuoteValue(maybe) = %s", got)
	}
	long := "start" + strings.Repeat("x", 100*1024) + "end"
	got := quoteValue(long)
	if len(got) > 2*maxShownValue || !strings.HasPrefix(got, `"start`) || !strings.Contains(got, `end" (102408 bytes)`) {
		t.Errorf("QuoteValue(100 KB) = %s", got)
	}
}

// The parts of the SPIFFE ID follow SPIFFE's and Kubernetes' rules, at
// their length bounds too (#21).
func TestSPIFFEIDPartsAreChecked(t *testing.T) {
	for _, c := range []struct {
		parse func(string) (string, error)
		good  []string
		bad   []string
	}{
		{parseTrustDomain, []string{"cluster.local", "td_1-x.example", strings.Repeat("a", 255)},
			[]string{"", "Cluster.local", "exämple.org", "a/b", "a b", strings.Repeat("a", 256)}},
		{parseDNSLabel, []string{"default", "a", "ns-0", strings.Repeat("a", 63)},
			[]string{"", "Prod", "-a", "a-", "a.b", "a_b", "nä", strings.Repeat("a", 64)}},
		{parseDNSSubdomain, []string{"default", "bookinfo-reviews", "a.b-c.d", strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("a", 61)},
			[]string{"", "Default", "a..b", ".a", "a.", "a_b", strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("a", 62)}},
		{parseKeyAlgorithm, []string{"ECDSA", "RSA"}, []string{"ecdsa", "EC", "ED25519", ""}},
		{parseECCCurve, []string{"P256", "P384"}, []string{"p256", "P521", ""}},
	} {
		for _, v := range c.good {
			if got, err := c.parse(v); err != nil || got != v {
				t.Errorf("%.40q: %q, %v; want it accepted", v, got, err)
			}
		}
		for _, v := range c.bad {
			if _, err := c.parse(v); err == nil {
				t.Errorf("%.40q (%d bytes) accepted", v, len(v))
			}
		}
	}
}
