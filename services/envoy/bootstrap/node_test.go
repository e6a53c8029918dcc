package bootstrap

import (
	"strings"
	"testing"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
)

func TestNodeID(t *testing.T) {
	for _, tc := range []struct {
		typ, pod, ns, domain string
		ips                  []string
		want                 string
	}{
		{"sidecar", "app-x", "ns", "", []string{"10.1.2.3", "10.9.9.9"}, "sidecar~10.1.2.3~app-x.ns~ns.svc.cluster.local"},
		{"router", "gw-1", "istio-system", "istio-system.svc.corp.example", []string{"fd00::7"}, "router~fd00::7~gw-1.istio-system~istio-system.svc.corp.example"},
		{"sidecar", "vm", "", "", []string{"192.168.0.4"}, "sidecar~192.168.0.4~vm.~.svc.cluster.local"},
	} {
		if got := NodeID(tc.typ, tc.ips, tc.pod, tc.ns, tc.domain); got != tc.want {
			t.Errorf("NodeID(%s, %v, %s, %s, %q) = %s, want %s", tc.typ, tc.ips, tc.pod, tc.ns, tc.domain, got, tc.want)
		}
	}
}

func TestServiceCluster(t *testing.T) {
	tracing := func(m meshv1alpha1.ProxyConfig_TracingServiceName) *meshv1alpha1.ProxyConfig {
		return &meshv1alpha1.ProxyConfig{ClusterName: &meshv1alpha1.ProxyConfig_TracingServiceName_{TracingServiceName: m}}
	}
	explicit := &meshv1alpha1.ProxyConfig{ClusterName: &meshv1alpha1.ProxyConfig_ServiceCluster{ServiceCluster: "from-mesh"}}
	app := map[string]string{"app": "reviews", "service.istio.io/canonical-name": "reviews-canonical"}
	for _, tc := range []struct {
		name, flag string
		pc         *meshv1alpha1.ProxyConfig
		labels     map[string]string
		workload   string
		ns         string
		want       string
	}{
		{"flag wins", "ratings", explicit, app, "w", "ns", "ratings"},
		{"flag istio-proxy falls back to app", "istio-proxy", explicit, app, "w", "ns", "reviews.ns"},
		{"mesh service cluster", "", explicit, app, "w", "ns", "from-mesh"},
		{"app label", "", nil, app, "w", "ns", "reviews.ns"},
		{"workload", "", nil, nil, "reviews-v1", "ns", "reviews-v1.ns"},
		{"namespace only", "", nil, nil, "", "ns", "istio-proxy.ns"},
		{"nothing", "", nil, nil, "", "", "istio-proxy"},
		{"tracing app label", "", tracing(meshv1alpha1.ProxyConfig_APP_LABEL_AND_NAMESPACE), app, "w", "ns", "reviews.ns"},
		{"tracing canonical only", "", tracing(meshv1alpha1.ProxyConfig_CANONICAL_NAME_ONLY), app, "w", "ns", "reviews-canonical"},
		{"tracing canonical and ns", "", tracing(meshv1alpha1.ProxyConfig_CANONICAL_NAME_AND_NAMESPACE), app, "w", "ns", "reviews-canonical.ns"},
		{"tracing canonical falls back to workload", "", tracing(meshv1alpha1.ProxyConfig_CANONICAL_NAME_AND_NAMESPACE), nil, "w", "ns", "w.ns"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ServiceCluster(tc.flag, tc.pc, tc.labels, tc.workload, tc.ns); got != tc.want {
				t.Errorf("ServiceCluster = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestParseDownwardAPI(t *testing.T) {
	got, err := ParseDownwardAPI("app=\"reviews\"\nempty=\"\"\nquote=\"a \\\"b\\\" =c\"\nno-equals-line\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got["app"] != "reviews" || got["empty"] != "" || got["quote"] != `a "b" =c` {
		t.Errorf("ParseDownwardAPI = %v", got)
	}
	if _, err := ParseDownwardAPI("app=reviews"); err == nil || !strings.Contains(err.Error(), "app=reviews") {
		t.Errorf("unquoted value: err = %v", err)
	}
}

func TestIPFamilies(t *testing.T) {
	for _, tc := range []struct {
		ips        []string
		all4, all6 bool
	}{
		{nil, true, false},
		{[]string{"10.0.0.1"}, true, false},
		{[]string{"::ffff:10.0.0.1"}, true, false},
		{[]string{"fd00::1", "::1"}, false, true},
		{[]string{"fd00::1", "10.0.0.1"}, false, false},
		{[]string{"junk"}, false, false},
	} {
		if AllIPv4(tc.ips) != tc.all4 || AllIPv6(tc.ips) != tc.all6 {
			t.Errorf("%v: AllIPv4 = %v, AllIPv6 = %v; want %v, %v", tc.ips, AllIPv4(tc.ips), AllIPv6(tc.ips), tc.all4, tc.all6)
		}
	}
}

func TestMetadataPrecedence(t *testing.T) {
	c := testConfig(t)
	c.Env = []string{
		"ISTIO_META_ISTIO_VERSION=1.99-custom", // beats the agent's version
		"ISTIO_META_NAME=ignored",              // the typed NAME (POD_NAME) wins
		`ISTIO_METAJSON_LABELS={"static":"yes","app":"from-env"}`,
		"ISTIO_META_=empty-key-kept",
	}
	c.LabelsFile = ""
	node, err := buildNode(c)
	if err != nil {
		t.Fatal(err)
	}
	md := node.metadata.GetFields()
	if md["ISTIO_VERSION"].GetStringValue() != "1.99-custom" {
		t.Errorf("ISTIO_VERSION = %v", md["ISTIO_VERSION"])
	}
	if md["NAME"].GetStringValue() != c.PodName {
		t.Errorf("NAME = %v", md["NAME"])
	}
	labels := md["LABELS"].GetStructValue().GetFields()
	if labels["static"].GetStringValue() != "yes" || labels["app"].GetStringValue() != "from-env" {
		t.Errorf("LABELS from ISTIO_METAJSON_LABELS = %v", labels)
	}
	if node.cluster != "from-env.bookinfo" {
		t.Errorf("cluster = %s", node.cluster)
	}
}
