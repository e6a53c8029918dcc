package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/meshagent/meshagent/cmd/meshagent/envoyadmin"
	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// `meshagent proxy-config` against the sample mesh pushed by the embedded
// control plane (issue 22): every table has one row for each thing Envoy's
// config_dump holds, with the columns istioctl prints; the sample's
// services are there as the YAML says; the secrets are the certificate
// Envoy got over SDS and the embedded CA's root; -o json lists the
// resources; `pilot-agent proxy-config` is the same command.
func TestProxyConfigTablesMatchTheConfigDump(t *testing.T) {
	mesh, _ := sampleMesh(t)
	// Envoy fetches a secret only when its config names one (#24), and the
	// sample mesh's clusters and listeners are plaintext: Istio's secure
	// metrics listener names the workload certificate and the root.
	t.Setenv("ENVOY_SECURE_METRICS_PORT", strconv.Itoa(testkit.FreePort(t)))
	// A certificate that does not rotate while the test compares it.
	p := e2ekit.StartStandalone(t, mesh, "", "--cert-lifetime", "1h")
	p.WaitStatus(t, "/healthz/ready", 200)
	p.WaitConfigDump(t, "outbound|9080||reviews.default.svc.cluster.local", "outbound|7070||ratings.default.svc.cluster.local")
	workload := e2ekit.NextCertificate(t, e2ekit.WatchSDSCertificates(t, filepath.Join(p.Root, "var/run/secrets/workload-spiffe-uds/socket")), "certificate")
	admin := fmt.Sprintf("127.0.0.1:%d", p.AdminPort)

	tables := checkProxyConfigTables(t, admin)
	for kind, want := range map[string][]string{
		"cluster":  {"reviews.default.svc.cluster.local 9080 - outbound EDS", "ratings.default.svc.cluster.local 7070 - outbound EDS", "PassthroughCluster - - - ORIGINAL_DST"},
		"listener": {"0.0.0.0 9080 ALL Route: 9080", "0.0.0.0 7070 ALL Route: 7070", "0.0.0.0 15001 ALL PassthroughCluster"},
		"route":    {"9080 ratings.default.svc.cluster.local:9080 ratings, ratings.default + 1 more... /*"},
		"endpoint": {"127.0.0.1:19081 HEALTHY OK outbound|9080||ratings.default.svc.cluster.local", "127.0.0.1:17070 HEALTHY OK outbound|7070||ratings.default.svc.cluster.local"},
		"secret": {fmt.Sprintf("default Cert Chain ACTIVE true %s", workload.SerialNumber.Text(16)),
			"ROOTCA CA ACTIVE true " + e2ekit.ReadCertificate(t, filepath.Join(p.Root, "var/lib/meshagent/ca/root-cert.pem")).SerialNumber.Text(16)},
	} {
		for _, w := range want {
			if !slices.ContainsFunc(tables[kind], func(row []string) bool { return strings.HasPrefix(strings.Join(row, " "), w) }) {
				t.Errorf("proxy-config %s has no row %q:\n%v", kind, w, tables[kind])
			}
		}
	}

	// Filters, as istioctl's.
	if rows := proxyConfigRows(t, e2ekit.AgentBinary, "cluster", "--admin", admin, "--fqdn", "ratings", "--port", "9080", "--direction", "outbound"); len(rows) != 1 ||
		rows[0][0] != "ratings.default.svc.cluster.local" {
		t.Errorf("cluster --fqdn ratings --port 9080 --direction outbound: %v", rows)
	}

	// -o json is the resources themselves.
	out, err := exec.Command(e2ekit.AgentBinary, "proxy-config", "cluster", "--admin", admin, "--fqdn", "reviews", "-o", "json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var clusters []struct{ Name, Type string }
	if err := json.Unmarshal(out, &clusters); err != nil || len(clusters) != 1 || clusters[0].Name != "outbound|9080||reviews.default.svc.cluster.local" || clusters[0].Type != "EDS" {
		t.Errorf("cluster --fqdn reviews -o json: %v %+v\n%s", err, clusters, out)
	}

	// proxy-status names the same certificate, and the name table from NDS.
	status, err := exec.Command(e2ekit.AgentBinary, "proxy-status", "--addr", strings.TrimPrefix(p.Base, "http://")).CombinedOutput()
	if err != nil {
		t.Fatalf("proxy-status: %v\n%s", err, status)
	}
	for _, want := range []string{"CERTIFICATE: spiffe://cluster.local/ns/default/sa/default serial " + workload.SerialNumber.Text(16),
		"NEXT RENEWAL: ", "ROOT SHA-256: ", "from NDS"} {
		if !strings.Contains(string(status), want) {
			t.Errorf("proxy-status lacks %q:\n%s", want, status)
		}
	}

	// The status page shows the same agent.
	page := mustGet(t, p.Base+"/debug/")
	for _, want := range []string{"controlplane", "certs", "envoy", ">SYNCED<", pki.WorkloadID, "names</b> (NDS)"} {
		if !strings.Contains(page, want) {
			t.Errorf("/debug/ lacks %q", want)
		}
	}

	// rootca-compare: Envoy's ROOTCA, got over SDS, holds the agent's root (#35).
	if out, err := exec.Command(e2ekit.AgentBinary, "proxy-config", "rootca-compare", "--admin", admin,
		"--status-addr", strings.TrimPrefix(p.Base, "http://")).CombinedOutput(); err != nil || !strings.Contains(string(out), "identical ROOTCA") {
		t.Errorf("proxy-config rootca-compare: %v\n%s", err, out)
	}

	// Installed as Istio's agent, the same command.
	pilotAgent := filepath.Join(t.TempDir(), "pilot-agent")
	if err := os.Symlink(e2ekit.AgentBinary, pilotAgent); err != nil {
		t.Fatal(err)
	}
	if rows := proxyConfigRows(t, pilotAgent, "secret", "--admin", admin); len(rows) != len(tables["secret"]) {
		t.Errorf("pilot-agent proxy-config secret: %v, want %v", rows, tables["secret"])
	}
}

// istioctl's other views against the standalone mesh (#35): bootstrap
// (its node), all (every table; -o json Envoy's own dump, in Envoy's field
// names), secret showing the agent's SDS secrets while Envoy has asked for
// none (the sample mesh names no secret), rootca-compare refusing an Envoy
// without ROOTCA, log levels set and reset through Envoy's admin, and an
// unknown view refused with a suggestion.
func TestProxyConfigViews(t *testing.T) {
	mesh, _ := sampleMesh(t)
	p := e2ekit.StartStandalone(t, mesh, "", "--cert-lifetime", "1h")
	p.WaitStatus(t, "/healthz/ready", 200)
	p.WaitConfigDump(t, "outbound|9080||reviews.default.svc.cluster.local")
	served := e2ekit.NextCertificate(t, e2ekit.WatchSDSCertificates(t, filepath.Join(p.Root, "var/run/secrets/workload-spiffe-uds/socket")), "certificate")
	admin := fmt.Sprintf("127.0.0.1:%d", p.AdminPort)
	statusAddr := strings.TrimPrefix(p.Base, "http://")
	run := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(e2ekit.AgentBinary, append([]string{"proxy-config"}, append(args, "--admin", admin, "--status-addr", statusAddr)...)...)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		_ = cmd.Run()
		return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
	}

	out, errOut, code := run("bootstrap")
	var boot struct {
		Bootstrap struct {
			Node struct {
				ID       string         `json:"id"`
				Metadata map[string]any `json:"metadata"`
			} `json:"node"`
		} `json:"bootstrap"`
	}
	if err := json.Unmarshal([]byte(out), &boot); code != 0 || err != nil || !strings.HasPrefix(boot.Bootstrap.Node.ID, "sidecar~") ||
		boot.Bootstrap.Node.Metadata["ISTIO_VERSION"] == nil {
		t.Errorf("bootstrap: exit %d, %v, node %+v\n%s%s", code, err, boot.Bootstrap.Node, out, errOut)
	}
	out, errOut, code = run("bootstrap", "-o", "short")
	testkit.Contains(t, "bootstrap -o short", out+errOut, "Node:", boot.Bootstrap.Node.ID, "Istio Version:", "Envoy Version:")

	out, errOut, code = run("all")
	if code != 0 {
		t.Errorf("all: exit %d\n%s", code, errOut)
	}
	testkit.Contains(t, "all", out, boot.Bootstrap.Node.ID, "reviews.default.svc.cluster.local     9080", "Route: 9080",
		"RESOURCE NAME", "127.0.0.1:19080", "outbound|9080||reviews.default.svc.cluster.local")
	out, _, code = run("all", "-o", "json")
	if _, err := envoyadmin.Decode([]byte(out)); code != 0 || err != nil || !strings.Contains(out, `"dynamic_active_clusters"`) ||
		!strings.Contains(out, `"dynamic_endpoint_configs"`) {
		t.Errorf("all -o json: exit %d, %v: want Envoy's own dump, with its endpoints, in its field names\n%.2000s", code, err, out)
	}

	out, errOut, code = run("secret")
	testkit.Contains(t, "secret", out, "showing what the agent serves over SDS",
		"default           Cert Chain     ACTIVE (agent)     true           "+served.SerialNumber.Text(16), "ROOTCA ")
	if code != 0 {
		t.Errorf("secret: exit %d\n%s", code, errOut)
	}
	out, errOut, code = run("secret", "-o", "json")
	if !json.Valid([]byte(out)) || !strings.Contains(errOut, "showing what the agent serves") || code != 0 {
		t.Errorf("secret -o json: exit %d; stdout must stay JSON, the note on stderr:\n%s\n%s", code, out, errOut)
	}

	out, errOut, code = run("rootca-compare")
	if code != 1 || !strings.Contains(errOut, "holds no ROOTCA") || !strings.Contains(out, "AGENT (SDS ROOTCA") {
		t.Errorf("rootca-compare against an Envoy without ROOTCA: exit %d\n%s%s", code, out, errOut)
	}

	out, _, code = run("log", "--level", "http:debug")
	if code != 0 || !strings.Contains(out, "  http: debug\n") || !strings.Contains(out, "  router: warning\n") {
		t.Errorf("log --level http:debug: exit %d\n%s", code, out)
	}
	out, _, code = run("log", "--reset")
	if code != 0 || !strings.Contains(out, "  http: warning\n") {
		t.Errorf("log --reset: exit %d; want Envoy's start level (warning) back\n%s", code, out)
	}
	if _, errOut, code = run("log", "--level", "nosuchlogger:debug"); code != 1 || !strings.Contains(errOut, "unknown logger name") {
		t.Errorf("log --level nosuchlogger:debug: exit %d, %s; want Envoy's refusal", code, errOut)
	}

	for view, want := range map[string]string{"boostrap": "did you mean bootstrap?", "nonsense": "unknown view"} {
		out, errOut, code = run(view)
		if code != 2 || !strings.Contains(errOut, want) || strings.Contains(out, "Available Commands") {
			t.Errorf("proxy-config %s: exit %d, stdout %q, stderr %q; want exit 2 and %q, no help", view, code, out, errOut, want)
		}
	}
}

// checkProxyConfigTables runs every proxy-config table against the Envoy
// admin at admin and checks it row for row against the config_dump, read
// here on its own: one cluster row per cluster, one listener row per
// filter chain, one route row per route (Istio leaves the passthrough
// out), one endpoint row per endpoint, one secret row per secret. It
// returns the tables' rows by kind.
func checkProxyConfigTables(t *testing.T, admin string) map[string][][]string {
	t.Helper()
	d, err := envoyadmin.Decode([]byte(mustGet(t, "http://"+admin+"/config_dump?include_eds")))
	if err != nil {
		t.Fatal(err)
	}
	tables := map[string][][]string{}
	for _, kind := range []string{"cluster", "listener", "route", "endpoint", "secret"} {
		tables[kind] = proxyConfigRows(t, e2ekit.AgentBinary, kind, "--admin", admin)
	}
	// columns is each row of the kind's table as the cells cols, joined
	// by a space.
	columns := func(kind string, cols ...int) []string {
		var out []string
		for _, row := range tables[kind] {
			cells := make([]string, len(cols))
			for i, c := range cols {
				cells[i] = row[c]
			}
			out = append(out, strings.Join(cells, " "))
		}
		return out
	}

	// Clusters: the names, each split as Istio names them.
	var clusters []string
	for _, c := range d.Clusters().GetDynamicActiveClusters() {
		clusters = append(clusters, mustUnpack[*clusterv3.Cluster](t, c.GetCluster()).GetName())
	}
	for _, c := range d.Clusters().GetStaticClusters() {
		clusters = append(clusters, mustUnpack[*clusterv3.Cluster](t, c.GetCluster()).GetName())
	}
	var fromTable []string
	for _, row := range tables["cluster"] {
		if row[1] == "-" {
			fromTable = append(fromTable, row[0])
		} else {
			fromTable = append(fromTable, strings.Join([]string{row[3], row[1], strings.TrimPrefix(row[2], "-"), row[0]}, "|"))
		}
	}
	sameSet(t, "cluster", fromTable, clusters)

	// Listeners: a row per filter chain, on the listener's port.
	var chainPorts []string
	for _, l := range d.Listeners().GetDynamicListeners() {
		ln := mustUnpack[*listenerv3.Listener](t, l.GetActiveState().GetListener())
		n := len(ln.GetFilterChains())
		if ln.GetDefaultFilterChain() != nil {
			n++
		}
		for range n {
			chainPorts = append(chainPorts, strconv.Itoa(int(ln.GetAddress().GetSocketAddress().GetPortValue())))
		}
	}
	for _, l := range d.Listeners().GetStaticListeners() {
		ln := mustUnpack[*listenerv3.Listener](t, l.GetListener())
		for range ln.GetFilterChains() {
			chainPorts = append(chainPorts, strconv.Itoa(int(ln.GetAddress().GetSocketAddress().GetPortValue())))
		}
	}
	sameSet(t, "listener", columns("listener", 1), chainPorts)

	// Routes: route name and virtual host, per route.
	var routes []string
	for _, r := range d.Routes().GetDynamicRouteConfigs() {
		rc := mustUnpack[*routev3.RouteConfiguration](t, r.GetRouteConfig())
		for _, vh := range rc.GetVirtualHosts() {
			for _, rt := range vh.GetRoutes() {
				if rt.GetRoute().GetCluster() != "PassthroughCluster" {
					routes = append(routes, rc.GetName()+" "+vh.GetName())
				}
			}
			if len(vh.GetRoutes()) == 0 {
				routes = append(routes, rc.GetName()+" "+vh.GetName()) // "/*", 404
			}
		}
	}
	sameSet(t, "route", columns("route", 0, 1), routes)

	// Endpoints: address and cluster.
	var endpoints []string
	for _, e := range d.Endpoints().GetDynamicEndpointConfigs() {
		cla := mustUnpack[*endpointv3.ClusterLoadAssignment](t, e.GetEndpointConfig())
		for _, loc := range cla.GetEndpoints() {
			for _, lb := range loc.GetLbEndpoints() {
				sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
				endpoints = append(endpoints, fmt.Sprintf("%s:%d %s", sa.GetAddress(), sa.GetPortValue(), cla.GetClusterName()))
			}
		}
	}
	sameSet(t, "endpoint", columns("endpoint", 0, 3), endpoints)

	// Secrets: the names, and each certificate's serial.
	var secrets []string
	for _, s := range d.Secrets().GetDynamicActiveSecrets() {
		sec := mustUnpack[*tlsv3.Secret](t, s.GetSecret())
		chain := sec.GetTlsCertificate().GetCertificateChain().GetInlineBytes()
		if chain == nil {
			chain = sec.GetValidationContext().GetTrustedCa().GetInlineBytes()
		}
		serial := ""
		if chain != nil {
			serial = pki.ParseLeaf(t, chain).SerialNumber.Text(16)
		}
		secrets = append(secrets, s.GetName()+" "+serial)
	}
	sameSet(t, "secret", columns("secret", 0, 4), secrets)
	return tables
}

func mustUnpack[T proto.Message](t *testing.T, a *anypb.Any) T {
	t.Helper()
	m, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{Resolver: envoyadmin.Resolver})
	if err != nil {
		t.Fatal(err)
	}
	v, ok := m.(T)
	if !ok {
		t.Fatalf("%s in the dump is a %T", a.GetTypeUrl(), m)
	}
	return v
}

// sameSet fails unless got and want hold the same strings as often.
func sameSet(t *testing.T, what string, got, want []string) {
	t.Helper()
	got, want = slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Errorf("proxy-config %s: the table holds\n  %s\nthe config_dump holds\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// proxyConfigRows runs `bin proxy-config kind args...` and splits its
// table into cells by the header's column starts (a cell may be empty, or
// hold spaces).
func proxyConfigRows(t *testing.T, bin, kind string, args ...string) [][]string {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"proxy-config", kind}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("proxy-config %s: %v\n%s", kind, err, out)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	var starts []int
	for i := range len(lines[0]) {
		if lines[0][i] != ' ' && (i == 0 || (i >= 2 && lines[0][i-2:i] == "  ")) {
			starts = append(starts, i)
		}
	}
	var rows [][]string
	for _, line := range lines[1:] {
		row := make([]string, len(starts))
		for c, start := range starts {
			end := len(line)
			if c+1 < len(starts) {
				end = min(starts[c+1], len(line))
			}
			if start < len(line) {
				row[c] = strings.TrimSpace(line[start:end])
			}
		}
		rows = append(rows, row)
	}
	return rows
}
