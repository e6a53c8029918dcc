package testkit

import (
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The stub resolver answers *.upstream.test over UDP and TCP on one port,
// NXDOMAIN for the rest, and counts what it answered.
func TestStubResolver(t *testing.T) {
	r, why := StartStubResolver(t)
	if r == nil {
		t.Skip(why)
	}
	for _, network := range []string{"udp", "tcp"} {
		c := &dns.Client{Net: network, Timeout: 2 * time.Second}
		resp, _, err := c.Exchange(new(dns.Msg).SetQuestion("www.upstream.test.", dns.TypeA), r.Addr())
		if err != nil || len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != "192.0.2.77" {
			t.Fatalf("%s: www.upstream.test = %v %v, want 192.0.2.77", network, resp, err)
		}
		resp, _, err = c.Exchange(new(dns.Msg).SetQuestion("example.com.", dns.TypeA), r.Addr())
		if err != nil || resp.Rcode != dns.RcodeNameError {
			t.Fatalf("%s: example.com = %v %v, want NXDOMAIN", network, resp, err)
		}
	}
	if got := r.Queries.Load(); got != 4 {
		t.Fatalf("Queries = %d, want 4", got)
	}
	if got, want := r.ResolvConf("svc.cluster.local"), "nameserver "+r.IP+"\nsearch svc.cluster.local\n"; got != want {
		t.Fatalf("ResolvConf = %q", got)
	}
}
