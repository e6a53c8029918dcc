package controlplane

import (
	"context"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/messages/nds"
	"github.com/meshagent/meshagent/testdata/testkit"
)

func readSample(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(sampleMesh)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withDetails is the sample plus a third service.
func withDetails(sample []byte) []byte {
	return []byte(strings.Replace(string(sample), "externalNames:", `  - name: details
    namespace: default
    vip: 10.96.0.12
    ports: [{port: 9080, protocol: http, endpoints: [127.0.0.1:19083]}]

externalNames:`, 1))
}

const detailsCluster = "outbound|9080||details.default.svc.cluster.local"

func clusterName(c *cluster.Cluster) string            { return c.GetName() }
func claName(c *endpoint.ClusterLoadAssignment) string { return c.GetClusterName() }
func listenerName(l *listener.Listener) string         { return l.GetName() }
func routeName(r *route.RouteConfiguration) string     { return r.GetName() }
func tableName(*nds.NameTable) string                  { return NameTableResourceName }
func sortedKeys[V any](m map[string]V) []string        { return slices.Sorted(maps.Keys(m)) }
func hasPrefix(s, prefix string) bool                  { return strings.HasPrefix(s, prefix) }

func degradedNaming(file string) func(messages.Health) bool {
	return func(h messages.Health) bool {
		return h.State == messages.Degraded && strings.Contains(h.Reason, file) && strings.Contains(h.Reason, "line")
	}
}

// An ADS client that behaves as Envoy does (CDS, then EDS for the clusters,
// LDS, then RDS for the listeners' routes) and as the agent does (NDS) gets
// the whole sidecar configuration and the name table on one stream; an
// edit to the file reaches the open stream as a new version; a bad edit
// keeps the last version and says why.
func TestSotWStreamGetsEverythingAndFollowsTheFile(t *testing.T) {
	sample := readSample(t)
	s := startServer(t, sample, messages.Ready, nil)
	c := openSotW(t, s.dial(t))

	cds := c.fetch(t, resource.ClusterType, nil)
	clusters := unpack(t, cds.GetResources(), clusterName)
	v1 := cds.GetVersionInfo()
	if !hasPrefix(v1, "1-") {
		t.Errorf("first version %q, want generation 1", v1)
	}
	var edsNames []string
	for name, cl := range clusters {
		if cl.GetType() == cluster.Cluster_EDS {
			edsNames = append(edsNames, name)
		}
	}
	slices.Sort(edsNames)
	if len(edsNames) != 3 || len(clusters) != 6 {
		t.Fatalf("clusters %q", sortedKeys(clusters))
	}
	eds := unpack(t, c.fetch(t, resource.EndpointType, edsNames).GetResources(), claName)
	if !slices.Equal(sortedKeys(eds), edsNames) {
		t.Errorf("endpoints for %q, want %q", sortedKeys(eds), edsNames)
	}
	lds := unpack(t, c.fetch(t, resource.ListenerType, nil).GetResources(), listenerName)
	if got := sortedKeys(lds); !slices.Equal(got, []string{"0.0.0.0_7070", "0.0.0.0_9080", "virtualInbound", "virtualOutbound"}) {
		t.Errorf("listeners %q", got)
	}
	rds := unpack(t, c.fetch(t, resource.RouteType, []string{"7070", "9080"}).GetResources(), routeName)
	if got := sortedKeys(rds); !slices.Equal(got, []string{"7070", "9080"}) {
		t.Errorf("routes %q", got)
	}
	ndsResp := c.fetch(t, NameTableType, nil)
	table := unpack(t, ndsResp.GetResources(), tableName)[NameTableResourceName]
	if got := sortedKeys(table.GetTable()); !slices.Equal(got, []string{"api.example.com", "ratings.default.svc.cluster.local", "reviews.default.svc.cluster.local"}) {
		t.Fatalf("name table hosts %q", got)
	}
	if _, err := nds.ToMessage(table, ndsResp.GetVersionInfo()); err != nil {
		t.Errorf("the agent's conversion refuses the table: %v", err)
	}

	// An edit: a new service.
	s.writeMesh(t, withDetails(sample))
	cds = c.next(t, resource.ClusterType)
	v2 := cds.GetVersionInfo()
	if !hasPrefix(v2, "2-") {
		t.Errorf("version after the edit %q, want generation 2", v2)
	}
	if _, ok := unpack(t, cds.GetResources(), clusterName)[detailsCluster]; !ok {
		t.Errorf("edit did not add %s", detailsCluster)
	}
	c.request(t, resource.ClusterType, nil, v2, cds.GetNonce())
	ndsResp = c.next(t, NameTableType)
	if _, ok := unpack(t, ndsResp.GetResources(), tableName)[NameTableResourceName].GetTable()["details.default.svc.cluster.local"]; !ok {
		t.Error("edit did not reach the name table")
	}
	c.request(t, NameTableType, nil, ndsResp.GetVersionInfo(), ndsResp.GetNonce())
	s.health.WaitLast(t, "ready", func(h messages.Health) bool { return h.State == messages.Ready })

	// A bad edit: the last good version stays, and health says why.
	s.writeMesh(t, []byte("services:\n  - name: details\n    vip: [oops\n"))
	h := s.health.WaitLast(t, "degraded naming the file and line", degradedNaming(s.file))
	if !strings.Contains(h.Reason, v2) {
		t.Errorf("reason %q does not name the version served (%s)", h.Reason, v2)
	}
	fresh := openSotW(t, s.dial(t))
	if got := fresh.fetch(t, resource.ClusterType, nil).GetVersionInfo(); got != v2 {
		t.Errorf("after a bad edit a new stream gets %q, want the last good %q", got, v2)
	}

	// Fixed: the next push on the first stream is the fixed file, so nothing
	// was pushed for the bad one.
	s.writeMesh(t, sample)
	cds = c.next(t, resource.ClusterType)
	if !hasPrefix(cds.GetVersionInfo(), "3-") {
		t.Errorf("version after the fix %q, want generation 3", cds.GetVersionInfo())
	}
	if _, ok := unpack(t, cds.GetResources(), clusterName)[detailsCluster]; ok {
		t.Errorf("fixed file still has %s", detailsCluster)
	}
	s.health.WaitLast(t, "ready again", func(h messages.Health) bool { return h.State == messages.Ready })
}

// Editors often write in place (truncate, then write): the debounce reads
// the file once it is quiet, and an identical rewrite is no new version.
func TestInPlaceWritesAndIdenticalRewrites(t *testing.T) {
	sample := readSample(t)
	s := startServer(t, sample, messages.Ready, nil)
	c := openSotW(t, s.dial(t))
	v1 := c.fetch(t, resource.ClusterType, nil).GetVersionInfo()

	if err := os.WriteFile(s.file, sample, 0o644); err != nil { // same content
		t.Fatal(err)
	}
	unchanged := s.svc.m.reloads.WithLabelValues("unchanged")
	testkit.WaitFor(t, "the identical rewrite to be read", func() bool { return testutil.ToFloat64(unchanged) >= 1 })
	if err := os.WriteFile(s.file, withDetails(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	cds := c.next(t, resource.ClusterType)
	if _, ok := unpack(t, cds.GetResources(), clusterName)[detailsCluster]; !ok || cds.GetVersionInfo() == v1 {
		t.Fatalf("in-place write: version %s (was %s), clusters %q", cds.GetVersionInfo(), v1, sortedKeys(unpack(t, cds.GetResources(), clusterName)))
	}
	if !hasPrefix(cds.GetVersionInfo(), "2-") {
		t.Errorf("version %q: the identical rewrite made a version of its own", cds.GetVersionInfo())
	}
}

// The delta protocol (Envoy's default in Istio, ISTIO_DELTA_XDS): the first
// response has every resource, an edit sends only what changed and names
// what was removed; NDS comes as one resource named "" as from istiod.
func TestDeltaStream(t *testing.T) {
	sample := readSample(t)
	s := startServer(t, withDetails(sample), messages.Ready, nil)
	stream, cancel := testkit.OpenStream(t, discovery.NewAggregatedDiscoveryServiceClient(s.dial(t)).DeltaAggregatedResources)
	defer cancel()
	resps := testkit.NewReceiver(t, cancel, stream.Recv)
	pending := map[string][]*discovery.DeltaDiscoveryResponse{}
	next := func(typeURL string) *discovery.DeltaDiscoveryResponse {
		t.Helper()
		if q := pending[typeURL]; len(q) > 0 {
			pending[typeURL] = q[1:]
			return q[0]
		}
		for {
			r := resps.Next(t, "a delta "+typeURL+" response")
			if r.GetTypeUrl() == typeURL {
				// ACK, as Envoy does.
				if err := stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: r.GetNonce()}); err != nil {
					t.Fatal(err)
				}
				return r
			}
			pending[r.GetTypeUrl()] = append(pending[r.GetTypeUrl()], r)
		}
	}
	subscribe := func(typeURL string, names ...string) {
		t.Helper()
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: typeURL, ResourceNamesSubscribe: names}
		if typeURL == resource.ClusterType {
			req.Node = sidecarNode
		}
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	resourceNames := func(r *discovery.DeltaDiscoveryResponse) []string {
		var out []string
		for _, res := range r.GetResources() {
			out = append(out, res.GetName())
		}
		slices.Sort(out)
		return out
	}

	subscribe(resource.ClusterType)
	if got := resourceNames(next(resource.ClusterType)); len(got) != 7 || !slices.Contains(got, detailsCluster) {
		t.Fatalf("delta CDS %q", got)
	}
	subscribe(resource.ListenerType)
	if got := resourceNames(next(resource.ListenerType)); len(got) != 4 {
		t.Fatalf("delta LDS %q", got)
	}
	subscribe(resource.EndpointType, detailsCluster)
	if got := resourceNames(next(resource.EndpointType)); !slices.Equal(got, []string{detailsCluster}) {
		t.Fatalf("delta EDS %q", got)
	}
	subscribe(NameTableType)
	r := next(NameTableType)
	if len(r.GetResources()) != 1 || r.GetResources()[0].GetName() != NameTableResourceName {
		t.Fatalf("delta NDS resources %v", r.GetResources())
	}
	var table nds.NameTable
	if err := r.GetResources()[0].GetResource().UnmarshalTo(&table); err != nil {
		t.Fatal(err)
	}
	if _, ok := table.GetTable()["details.default.svc.cluster.local"]; !ok {
		t.Fatalf("delta NDS table %v", sortedKeys(table.GetTable()))
	}

	// Remove details: CDS names it removed and sends nothing else (the
	// other clusters did not change); EDS removes its assignment; NDS sends
	// the new table.
	s.writeMesh(t, sample)
	cds := next(resource.ClusterType)
	if !slices.Equal(cds.GetRemovedResources(), []string{detailsCluster}) || len(cds.GetResources()) != 0 {
		t.Errorf("delta CDS after removal: resources %q, removed %q", resourceNames(cds), cds.GetRemovedResources())
	}
	if eds := next(resource.EndpointType); !slices.Equal(eds.GetRemovedResources(), []string{detailsCluster}) {
		t.Errorf("delta EDS after removal: removed %q", eds.GetRemovedResources())
	}
	r = next(NameTableType)
	if err := r.GetResources()[0].GetResource().UnmarshalTo(&table); err != nil {
		t.Fatal(err)
	}
	if _, ok := table.GetTable()["details.default.svc.cluster.local"]; ok {
		t.Error("removed service still in the name table")
	}
}

// The separate discovery services work too (Envoy without ADS).
func TestClusterDiscoveryService(t *testing.T) {
	s := startServer(t, readSample(t), messages.Ready, nil)
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
	defer cancel()
	stream, err := clusterservice.NewClusterDiscoveryServiceClient(s.dial(t)).StreamClusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: sidecarNode, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GetResources()) != 6 {
		t.Errorf("CDS has %d clusters", len(r.GetResources()))
	}
}

// A first file that does not load: the server runs, says why, serves
// nothing, and serves the file once it is fixed.
func TestBadFirstFileThenFixed(t *testing.T) {
	s := startServer(t, []byte("services: [\n"), messages.Starting, nil)
	h := s.health.WaitLast(t, "starting, naming the file and line", func(h messages.Health) bool {
		return h.State == messages.Starting && strings.Contains(h.Reason, s.file) && strings.Contains(h.Reason, "line 1")
	})
	if !strings.Contains(h.Reason, "no mesh loaded yet") {
		t.Errorf("reason %q", h.Reason)
	}
	c := openSotW(t, s.dial(t))
	c.request(t, resource.ClusterType, nil, "", "")
	s.writeMesh(t, readSample(t))
	if v := c.next(t, resource.ClusterType).GetVersionInfo(); !hasPrefix(v, "1-") {
		t.Errorf("first version %q", v)
	}
	s.health.WaitLast(t, "ready", func(h messages.Health) bool { return h.State == messages.Ready })
}

// A mesh file whose directory does not exist yet (a ConfigMap mounted
// late): the server runs and says so, and serves the file once the
// directory and the file appear (#26; it used to fail Serve and be
// restarted with backoff).
func TestMeshDirectoryAppearsLate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "mesh")
	file := filepath.Join(dir, "mesh.yaml")
	health := &testkit.HealthRecorder{}
	cfg := NewConfig("127.0.0.1:0", file)
	svc, err := New(cfg, Inputs{}, Outputs{}, messages.NewRuntime(Name, health, nil, nil, testkit.NewLogBuffer(t).Logger()))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Serve(t, svc)
	health.WaitLast(t, "starting, naming the file", func(h messages.Health) bool {
		return h.State == messages.Starting && strings.Contains(h.Reason, file)
	})
	testkit.WriteFile(t, file, readSample(t))
	health.WaitLast(t, "ready once the directory appears", func(h messages.Health) bool { return h.State == messages.Ready })
}

// Restarting the service (as the tree does) serves again with a new
// version: a version is never reused for other content.
func TestRestartContinuesGenerations(t *testing.T) {
	s := startServer(t, readSample(t), messages.Ready, nil)
	s.stop(t)
	s.svc.health.Report(messages.Stopped, "stopped") // what the runner does
	s.start(t)
	s.health.WaitLast(t, "ready after restart", func(h messages.Health) bool { return h.State == messages.Ready })
	c := openSotW(t, s.dial(t))
	if v := c.fetch(t, resource.ClusterType, nil).GetVersionInfo(); !hasPrefix(v, "2-") {
		t.Errorf("version after restart %q, want generation 2", v)
	}
}

func TestTokenRequired(t *testing.T) {
	s := startServer(t, readSample(t), messages.Ready, func(c *Config) { c.Token = "s3cret" })
	conn := s.dial(t)
	for _, tc := range []struct {
		name, header string
		want         codes.Code
	}{
		{"none", "", codes.Unauthenticated},
		{"wrong", "Bearer nope", codes.Unauthenticated},
		{"right", "Bearer s3cret", codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
			defer cancel()
			if tc.header != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", tc.header)
			}
			stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
			if err == nil {
				err = stream.Send(&discovery.DiscoveryRequest{Node: sidecarNode, TypeUrl: resource.ClusterType})
			}
			var r *discovery.DiscoveryResponse
			// A Send after the server has ended the stream returns io.EOF;
			// the stream's status then comes from Recv (grpc's SendMsg).
			if err == nil || errors.Is(err, io.EOF) {
				r, err = stream.Recv()
			}
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code %v (%v), want %v", got, err, tc.want)
			}
			if tc.want == codes.OK && len(r.GetResources()) == 0 {
				t.Fatal("no clusters")
			}
		})
	}
}

// Unknown types (istiod's ProxyConfig, say) leave the stream up.
func TestUnknownTypeKeepsStream(t *testing.T) {
	s := startServer(t, readSample(t), messages.Ready, nil)
	c := openSotW(t, s.dial(t))
	c.request(t, "type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig", nil, "", "")
	if r := c.fetch(t, resource.ClusterType, nil); len(r.GetResources()) != 6 {
		t.Fatalf("CDS after an unknown type: %d clusters", len(r.GetResources()))
	}
}

// A client that rejects a response is counted and logged, and is answered
// again (after a pause that keeps a NACK loop cheap).
func TestNACKIsCountedAndLogged(t *testing.T) {
	s := startServer(t, readSample(t), messages.Ready, nil)
	c := openSotW(t, s.dial(t))
	c.request(t, resource.ClusterType, nil, "", "")
	r := c.next(t, resource.ClusterType)
	if err := c.stream.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: r.GetNonce(),
		ErrorDetail: &statuspb.Status{Code: int32(codes.InvalidArgument), Message: "cluster refused for the test"}}); err != nil {
		t.Fatal(err)
	}
	if again := c.next(t, resource.ClusterType); again.GetVersionInfo() != r.GetVersionInfo() {
		t.Errorf("after a NACK: version %q, want %q again", again.GetVersionInfo(), r.GetVersionInfo())
	}
	if n := testutil.ToFloat64(s.svc.m.nacks.WithLabelValues(resource.ClusterType)); n != 1 {
		t.Errorf("NACKs counted: %v", n)
	}
	if !strings.Contains(s.logs.String(), "cluster refused for the test") {
		t.Errorf("NACK not logged:\n%s", s.logs)
	}
}
