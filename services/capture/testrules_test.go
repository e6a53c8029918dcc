package capture

import (
	"time"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// testRules is istio-iptables' config with no flag given, as cmd builds
// it: the env table's defaults (#34) and istio-iptables' flag-only
// --envoy-port and uid (cmd's istio.go).
func testRules(t testkit.Failer) RulesConfig {
	return RulesConfig{
		ProxyPort:               "15001",
		InboundCapturePort:      testkit.TableDefault[string](t, "INBOUND_CAPTURE_PORT"),
		InboundTunnelPort:       testkit.TableDefault[string](t, "INBOUND_TUNNEL_PORT"),
		ProxyUID:                "1337",
		ProxyGID:                "1337",
		InboundTProxyMark:       testkit.TableDefault[string](t, "ISTIO_INBOUND_TPROXY_MARK"),
		InboundTProxyRouteTable: testkit.TableDefault[string](t, "ISTIO_INBOUND_TPROXY_ROUTE_TABLE"),
		OwnerGroupsInclude:      testkit.TableDefault[string](t, "ISTIO_OUTBOUND_OWNER_GROUPS"),
		IptablesProbePort:       testkit.TableDefault[uint16](t, "IPTABLES_PROBE_PORT"),
		ProbeTimeout:            testkit.TableDefault[time.Duration](t, "PROBE_TIMEOUT"),
		HostIPv4LoopbackCidr:    testkit.TableDefault[string](t, "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR"),
	}
}
