package capture

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

func prefixes(s ...string) func() ([]netip.Prefix, error) {
	return func() ([]netip.Prefix, error) {
		var out []netip.Prefix
		for _, p := range s {
			out = append(out, netip.MustParsePrefix(p))
		}
		return out, nil
	}
}

func TestEnableIPv6FromHostAddress(t *testing.T) {
	for _, tc := range []struct {
		addrs    []string
		dual     bool
		wantIP   string
		wantIPv6 bool
	}{
		{[]string{"127.0.0.1/8", "::1/128", "fe80::1/64", "192.0.2.10/24", "2001:db8::10/64"}, false, "192.0.2.10", false},
		{[]string{"127.0.0.1/8", "fe80::1/64", "2001:db8::10/64", "192.0.2.10/24"}, false, "2001:db8::10", true},
		{[]string{"192.0.2.10/24", "2001:db8::10/64"}, true, "192.0.2.10", true},
		{[]string{"192.0.2.10/24", "fe80::2/64"}, true, "192.0.2.10", false},
		{[]string{"169.254.1.1/16", "::ffff:192.0.2.10/128"}, false, "192.0.2.10", false},
	} {
		cfg := testRules(t)
		cfg.DualStack = tc.dual
		if err := cfg.FillHostInputs(HostInputs{InterfaceAddrs: prefixes(tc.addrs...)}); err != nil {
			t.Fatal(err)
		}
		if cfg.HostIP.String() != tc.wantIP || cfg.EnableIPv6 != tc.wantIPv6 {
			t.Errorf("%v dual=%v: HostIP %s EnableIPv6 %v; want %s %v", tc.addrs, tc.dual, cfg.HostIP, cfg.EnableIPv6, tc.wantIP, tc.wantIPv6)
		}
	}
	cfg := testRules(t)
	if err := cfg.FillHostInputs(HostInputs{InterfaceAddrs: prefixes("127.0.0.1/8", "fe80::1/64")}); !errors.Is(err, ErrNoLocalIP) {
		t.Errorf("only loopback/link-local: err %v, want ErrNoLocalIP", err)
	}
}

func TestDNSServersFromResolvConf(t *testing.T) {
	path := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(path, []byte("search svc.cluster.local\nnameserver 10.96.0.10\nnameserver ::127.0.0.53\nnameserver 2001:db8::53\noptions ndots:5\n"), 0o644)
	cfg := testRules(t)
	cfg.RedirectDNS = true
	if err := cfg.FillHostInputs(HostInputs{ResolvConf: path, InterfaceAddrs: prefixes("192.0.2.1/24")}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.DNSServersV4, []string{"10.96.0.10"}) || !slices.Equal(cfg.DNSServersV6, []string{"::7f00:35", "2001:db8::53"}) {
		t.Errorf("servers v4 %v v6 %v", cfg.DNSServersV4, cfg.DNSServersV6)
	}
	// Capture-all does not read resolv.conf; a missing file is an error otherwise.
	cfg = testRules(t)
	cfg.RedirectDNS, cfg.CaptureAllDNS = true, true
	if err := cfg.FillHostInputs(HostInputs{ResolvConf: "/nonexistent", InterfaceAddrs: prefixes("192.0.2.1/24")}); err != nil {
		t.Errorf("capture-all read resolv.conf: %v", err)
	}
	cfg.CaptureAllDNS = false
	err := cfg.FillHostInputs(HostInputs{ResolvConf: "/nonexistent/resolv.conf", InterfaceAddrs: prefixes("192.0.2.1/24")})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/resolv.conf") {
		t.Errorf("missing resolv.conf: %v", err)
	}
}

// TestCaptureAllDNSRules: without servers, capture-all redirects every DNS
// query in both families, with the conntrack zones unqualified.
func TestCaptureAllDNSRules(t *testing.T) {
	cfg := testRules(t)
	cfg.RedirectDNS, cfg.CaptureAllDNS, cfg.EnableIPv6 = true, true, true
	rs := Build(cfg)
	for _, rules := range [][]Rule{rs.V4, rs.V6} {
		text := RestoreInput(rules)
		testkit.Contains(t, "capture-all", text,
			"-A ISTIO_OUTPUT -j ISTIO_OUTPUT_DNS",
			"-A ISTIO_OUTPUT_DNS -p udp --dport 53 -j REDIRECT --to-port 15053",
			"-A ISTIO_OUTPUT_DNS -p tcp --dport 53 -j REDIRECT --to-ports 15053",
			"-A PREROUTING -j ISTIO_INBOUND",
			"-A ISTIO_INBOUND -p udp --sport 53 -j CT --zone 1",
		)
	}
}
