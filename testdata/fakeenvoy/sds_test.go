package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/envoyadmin"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// sdsFixture is a stand-in whose ADS (xds-grpc) and SDS (sds-grpc) pipes
// both lead to one test control plane.
type sdsFixture struct {
	hr   *hrFixture
	x    *xdsserver.Server
	sock string
}

// newSDSFixture writes the bootstrap; retry is the ads_config's
// retry_policy JSON ("" for none).
func newSDSFixture(t *testing.T, retry string) *sdsFixture {
	t.Helper()
	dir := testkit.ShortTempDir(t, "fe-sds")
	sock := filepath.Join(dir, "XDS")
	x, err := xdsserver.Start(xdsserver.Options{Addr: "unix:" + sock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Close)
	f := &hrFixture{bin: standInBinary(t), base: uniqueBaseID(t), admin: testkit.FreePort(t)}
	f.boot = filepath.Join(dir, "bootstrap.json")
	testkit.WriteFile(t, f.boot, []byte(adsBootstrap(f.admin, retry, sock)))
	return &sdsFixture{hr: f, x: x, sock: sock}
}

// restart is the control plane back on the same socket after Stop, a new
// server (counting afresh) with the resources given.
func (f *sdsFixture) restart(t *testing.T, resources map[resource.Type][]types.Resource) *xdsserver.Server {
	t.Helper()
	x, err := xdsserver.Start(xdsserver.Options{Addr: "unix:" + f.sock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Close)
	if err := x.SetResources("v2", resources); err != nil { // a new version: the stand-in holds v1
		t.Fatal(err)
	}
	return x
}

// adsBootstrap: the admin, CDS and LDS over ADS on the xds-grpc pipe
// (with retry, when not "", as its retry_policy), and the sds-grpc pipe on
// the same socket.
func adsBootstrap(admin int, retry, sock string) string {
	if retry != "" {
		retry = `, "retry_policy": ` + retry
	}
	return fmt.Sprintf(adsBootstrapJSON, admin, retry, sock, sock)
}

const adsBootstrapJSON = `{
  "node": {"id": "sidecar~127.0.0.1~app.default~default.svc.cluster.local", "cluster": "app.default"},
  "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": %d}}},
  "dynamic_resources": {
    "lds_config": {"ads": {}, "resource_api_version": "V3", "initial_fetch_timeout": "0s"},
    "cds_config": {"ads": {}, "resource_api_version": "V3", "initial_fetch_timeout": "0s"},
    "ads_config": {"api_type": "GRPC", "transport_api_version": "V3", "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"%s}}]}
  },
  "static_resources": {"clusters": [
    {"name": "xds-grpc", "type": "STATIC", "connect_timeout": "1s",
     "load_assignment": {"cluster_name": "xds-grpc", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": %q}}}}]}]}},
    {"name": "sds-grpc", "type": "STATIC", "connect_timeout": "1s",
     "load_assignment": {"cluster_name": "sds-grpc", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": %q}}}}]}]}}
  ]}
}`

func secret(name string) *tlsv3.Secret {
	return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: []byte("ROOT " + name)}}}}}
}

// dump is the stand-in's /config_dump: its warming and active CDS
// clusters, and its SDS secrets.
func (f *sdsFixture) dump(t *testing.T) (warming, active, secrets []string) {
	t.Helper()
	_, body := testkit.MustFetch(t, "GET", fmt.Sprintf("http://127.0.0.1:%d/config_dump", f.hr.admin))
	d, err := envoyadmin.Decode([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range d.Clusters().GetDynamicWarmingClusters() {
		warming = append(warming, clusterName(t, c.GetCluster()))
	}
	for _, c := range d.Clusters().GetDynamicActiveClusters() {
		active = append(active, clusterName(t, c.GetCluster()))
	}
	for _, s := range d.Secrets().GetDynamicActiveSecrets() {
		secrets = append(secrets, s.GetName())
	}
	slices.Sort(secrets)
	return warming, active, secrets
}

func clusterName(t *testing.T, a *anypb.Any) string {
	c := &clusterv3.Cluster{}
	if err := a.UnmarshalTo(c); err != nil {
		t.Fatal(err)
	}
	return c.GetName()
}

func (f *sdsFixture) ready() (int, string) {
	return testkit.Fetch("GET", fmt.Sprintf("http://127.0.0.1:%d/ready", f.hr.admin))
}

// As Envoy (#24): a cluster naming SDS secrets with Istio's
// initial_fetch_timeout of 0s stays warming, and the server
// PRE_INITIALIZING without asking for listeners, for as long as the
// secrets do not come; they are asked for one stream each; once they
// come, the cluster is active and the server LIVE.
func TestSecretsNotServedKeepClusterWarmingAndServerNotReady(t *testing.T) {
	t.Parallel()
	f := newSDSFixture(t, "")
	const name = "outbound|9080||reviews.default.svc.cluster.local"
	resources := map[resource.Type][]types.Resource{
		resource.ClusterType:  {xdsserver.MTLSCluster(name, xdsserver.SDSSecret("default", 0), xdsserver.SDSSecret("ROOTCA", 0))},
		resource.ListenerType: {},
	}
	if err := f.x.SetResources("v1", resources); err != nil {
		t.Fatal(err)
	}
	f.hr.start(t, 0, nil)

	testkit.WaitFor(t, "the cluster ACKed and both secrets asked for, one stream each", func() bool {
		st := f.x.Stats()
		return st.ACKs[resource.ClusterType] >= 1 && st.Requests[resource.SecretType] >= 2 && st.Streams >= 3
	})
	if code, body := f.ready(); code != 503 || body != "PRE_INITIALIZING\n" {
		t.Errorf("/ready without the secrets = %d %q; want 503 PRE_INITIALIZING (Envoy waits: initial_fetch_timeout 0s)", code, body)
	}
	if warming, active, secrets := f.dump(t); !slices.Equal(warming, []string{name}) || len(active) != 0 || len(secrets) != 0 {
		t.Errorf("config_dump without the secrets: warming %v, active %v, secrets %v; want the cluster warming, nothing active", warming, active, secrets)
	}
	if n := f.x.Stats().Requests[resource.ListenerType]; n != 0 {
		t.Errorf("LDS asked for %d times before the clusters were initialised; Envoy asks once they are", n)
	}

	resources[resource.SecretType] = []types.Resource{secret("default"), secret("ROOTCA")}
	if err := f.x.SetResources("v2", resources); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "/ready 200 once the secrets came", func() bool { code, _ := f.ready(); return code == 200 })
	if warming, active, secrets := f.dump(t); len(warming) != 0 || !slices.Equal(active, []string{name}) || !slices.Equal(secrets, []string{"ROOTCA", "default"}) {
		t.Errorf("config_dump with the secrets: warming %v, active %v, secrets %v; want the cluster active, both secrets", warming, active, secrets)
	}
}

// A secret whose SDS config has an initial_fetch_timeout lets init go on
// without it when the timeout passes, counted in
// sds.<name>.init_fetch_timeout, as Envoy's SdsApi.
func TestSecretInitialFetchTimeoutLetsInitGoOn(t *testing.T) {
	t.Parallel()
	f := newSDSFixture(t, "")
	if err := f.x.SetResources("v1", map[resource.Type][]types.Resource{
		resource.ClusterType:  {xdsserver.MTLSCluster("c", xdsserver.SDSSecret("spare", 100*time.Millisecond), xdsserver.SDSSecret("spare-root", 100*time.Millisecond))},
		resource.ListenerType: {},
	}); err != nil {
		t.Fatal(err)
	}
	f.hr.start(t, 0, nil)
	testkit.WaitFor(t, "/ready 200 after the secrets' initial fetch timeout", func() bool { code, _ := f.ready(); return code == 200 })
	_, stats := testkit.MustFetch(t, "GET", fmt.Sprintf("http://127.0.0.1:%d/stats?usedonly", f.hr.admin))
	for _, want := range []string{"sds.spare.init_fetch_timeout: 1", "sds.spare-root.init_fetch_timeout: 1"} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(want) + `$`).MatchString(stats) {
			t.Errorf("/stats has no %q:\n%s", want, stats)
		}
	}
}
