package capture

import (
	"strconv"
	"strings"
	"testing"
)

// TestMultiportChunking: 1 port is "--dport", more are multiport matches of
// at most 15 ports each, in order.
func TestMultiportChunking(t *testing.T) {
	var ports []string
	for p := 1000; p < 1032; p++ {
		ports = append(ports, strconv.Itoa(p))
	}
	var got [][]string
	multiportRules(ports, func(m ...string) { got = append(got, m) })
	if len(got) != 3 {
		t.Fatalf("32 ports gave %d rules, want 3: %v", len(got), got)
	}
	wantChunks := []string{strings.Join(ports[:15], ","), strings.Join(ports[15:30], ","), strings.Join(ports[30:], ",")}
	for i, m := range got {
		if len(m) != 4 || m[0] != "-m" || m[1] != "multiport" || m[2] != "--dports" || m[3] != wantChunks[i] {
			t.Errorf("rule %d match = %v, want -m multiport --dports %s", i, m, wantChunks[i])
		}
	}
	got = nil
	multiportRules([]string{"22"}, func(m ...string) { got = append(got, m) })
	if len(got) != 1 || strings.Join(got[0], " ") != "--dport 22" {
		t.Errorf("one port gave %v, want --dport 22", got)
	}

	// Through the builder: 16 excluded outbound ports = 2 tcp + 2 udp rules.
	cfg := testRules(t)
	cfg.OutboundPortsExclude = strings.Join(ports[:16], ",")
	n := 0
	for _, r := range Build(cfg).V4 {
		if r.Chain == ChainOutput && strings.Contains(strings.Join(r.Params, " "), "multiport --dports") && r.Target() == "RETURN" {
			n++
		}
	}
	if n != 4 {
		t.Errorf("16 excluded outbound ports gave %d multiport rules, want 4", n)
	}
}

func TestValidateNamesFlagAndValue(t *testing.T) {
	for _, tc := range []struct {
		mutate func(*RulesConfig)
		want   []string
	}{
		{func(c *RulesConfig) { c.ProxyPort = "70000" }, []string{"--envoy-port", "70000"}},
		{func(c *RulesConfig) { c.InboundCapturePort = "abc" }, []string{"--inbound-capture-port", "abc"}},
		{func(c *RulesConfig) { c.InboundPortsInclude = "80,x" }, []string{"--istio-inbound-ports", "80,x"}},
		{func(c *RulesConfig) { c.OutboundPortsExclude = "0" }, []string{"--istio-local-outbound-ports-exclude"}},
		{func(c *RulesConfig) { c.OutboundIPRangesInclude = "10.0.0.0/33" }, []string{"--istio-service-cidr", "10.0.0.0/33"}},
		{func(c *RulesConfig) { c.OutboundIPRangesExclude = "*" }, []string{"--istio-service-exclude-cidr", `"*"`}},
		{func(c *RulesConfig) { c.OutboundIPRangesExclude = "bogus" }, []string{"--istio-service-exclude-cidr", "bogus"}},
		{func(c *RulesConfig) { c.InboundInterceptionMode = "tproxy" }, []string{"--istio-inbound-interception-mode", "tproxy"}},
		{func(c *RulesConfig) { c.ProxyUID = "istio" }, []string{"--proxy-uid", "istio"}},
		{func(c *RulesConfig) { c.ProxyGID = "-1" }, []string{"--proxy-gid", "-1"}},
		{func(c *RulesConfig) { c.ExcludeInterfaces = "eth0,averyveryverylongname" }, []string{"--istio-exclude-interfaces", "averyveryverylongname"}},
		{func(c *RulesConfig) { c.RerouteVirtualInterfaces = "a/b" }, []string{"--kube-virt-interfaces", "a/b"}},
		{func(c *RulesConfig) {
			var g []string
			for i := range 65 {
				g = append(g, strconv.Itoa(i+1000))
			}
			c.OwnerGroupsInclude = strings.Join(g, ",")
		}, []string{"ISTIO_OUTBOUND_OWNER_GROUPS", "65 groups"}},
		{func(c *RulesConfig) { c.HostIPv4LoopbackCidr = "10.0.0.1/32" }, []string{"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "10.0.0.1/32"}},
		{func(c *RulesConfig) { c.HostIPv4LoopbackCidr = "127.0.0.1/7" }, []string{"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "mask"}},
		{func(c *RulesConfig) { c.InboundTProxyMark = "x" }, []string{"--istio-inbound-tproxy-mark", "x"}},
		{func(c *RulesConfig) { c.ForceIptablesBinary = "foo" }, []string{"--force-iptables-binary", "foo"}},
	} {
		cfg := testRules(t)
		tc.mutate(&cfg)
		err := cfg.Validate()
		if err == nil {
			t.Errorf("Validate accepted bad config; want error with %v", tc.want)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not name %q", err, w)
			}
		}
	}
	ok := testRules(t)
	ok.InboundPortsInclude, ok.InboundPortsExclude, ok.OutboundIPRangesInclude = "*", "15090,15021,15020", "*"
	if err := ok.Validate(); err != nil {
		t.Errorf("default sidecar config rejected: %v", err)
	}
}
