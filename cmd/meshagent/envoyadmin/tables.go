package envoyadmin

// The tables of `istioctl proxy-config cluster|listener|route|endpoint|
// secret`, read from the dump (issue 22). The columns, the way a name is
// split and a filter chain described are Istio's (istioctl/pkg/writer/
// envoy/configdump) so that an operator reads the same table inside the pod
// as from istioctl; the code is ours.

import (
	"cmp"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Table is one proxy-config table: its header, its rows, and the resources
// the rows were read from (what -o json|yaml prints).
type Table struct {
	Header    []string
	Rows      [][]string
	Resources []proto.Message
}

// Istio's passthrough and black hole clusters, named as themselves (not
// "Cluster: ...") in a DESTINATION.
const (
	passthroughCluster = "PassthroughCluster"
	blackHoleCluster   = "BlackHoleCluster"
)

// unpackEach is the T that get finds in each of a dump's entries, those
// that cannot be read as a T left out.
func unpackEach[T proto.Message, E any](entries []E, get func(E) *anypb.Any) []T {
	var out []T
	for _, e := range entries {
		if m := unpack[T](get(e)); m.ProtoReflect().IsValid() { // false for the nil of a failed unpack
			out = append(out, m)
		}
	}
	return out
}

// unpack is the message an Any holds, nil when it cannot be read.
func unpack[T proto.Message](a *anypb.Any) T {
	var zero T
	if a == nil {
		return zero
	}
	m, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{Resolver: Resolver})
	if t, ok := m.(T); err == nil && ok {
		return t
	}
	return zero
}

// ClusterFilter keeps the clusters whose name holds each set field, as
// istioctl's does: FQDN, direction and subset as substrings, the port as
// "|port|".
type ClusterFilter struct {
	FQDN, Direction, Subset string
	Port                    int
}

func (f ClusterFilter) keeps(name string) bool {
	return strings.Contains(name, f.FQDN) && strings.Contains(name, f.Direction) && strings.Contains(name, f.Subset) &&
		(f.Port == 0 || strings.Contains(name, "|"+strconv.Itoa(f.Port)+"|"))
}

// clusterKey is an Istio cluster name split ("outbound|9080|v1|reviews.
// default.svc.cluster.local"); a name of another form is its FQDN alone.
type clusterKey struct {
	direction, subset, fqdn string
	port                    int
	istio                   bool
}

func splitClusterName(name string) clusterKey {
	parts := strings.Split(name, "|")
	if len(parts) != 4 {
		return clusterKey{fqdn: name}
	}
	port, _ := strconv.Atoi(parts[1])
	return clusterKey{direction: parts[0], port: port, subset: parts[2], fqdn: parts[3], istio: true}
}

// ClusterTable is `proxy-config cluster`: dynamic then static clusters, sorted
// by FQDN, subset, port, direction.
func (d *Dump) ClusterTable(f ClusterFilter) Table {
	cd := d.Clusters()
	clusters := append(unpackEach[*clusterv3.Cluster](cd.GetDynamicActiveClusters(), (*adminv3.ClustersConfigDump_DynamicCluster).GetCluster),
		unpackEach[*clusterv3.Cluster](cd.GetStaticClusters(), (*adminv3.ClustersConfigDump_StaticCluster).GetCluster)...)
	clusters = slices.DeleteFunc(clusters, func(c *clusterv3.Cluster) bool { return !f.keeps(c.GetName()) })
	slices.SortStableFunc(clusters, func(a, b *clusterv3.Cluster) int {
		ka, kb := splitClusterName(a.GetName()), splitClusterName(b.GetName())
		return cmp.Or(cmp.Compare(ka.fqdn, kb.fqdn), cmp.Compare(ka.subset, kb.subset),
			cmp.Compare(ka.port, kb.port), cmp.Compare(ka.direction, kb.direction))
	})
	t := Table{Header: []string{"SERVICE FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE", "DESTINATION RULE"}}
	for _, c := range clusters {
		k := splitClusterName(c.GetName())
		row := []string{k.fqdn, "-", "-", "-", clusterType(c), istioConfig(c.GetMetadata())}
		if k.istio {
			row[1], row[3] = strconv.Itoa(k.port), k.direction
			if k.subset != "" {
				row[2] = k.subset
			}
		}
		t.Rows = append(t.Rows, row)
		t.Resources = append(t.Resources, c)
	}
	return t
}

// clusterType is the cluster's discovery type, or its custom type's name.
func clusterType(c *clusterv3.Cluster) string {
	if ct := c.GetClusterType(); ct != nil {
		return ct.GetName()
	}
	return c.GetType().String()
}

// istioConfig is the Istio resource that made a cluster or route (its
// metadata's istio.config, "/apis/networking.istio.io/v1alpha3/namespaces/
// NS/destination-rule/NAME") as NAME.NS; "" when none did.
func istioConfig(md *corev3.Metadata) string {
	path := md.GetFilterMetadata()["istio"].GetFields()["config"].GetStringValue()
	if path == "" {
		return ""
	}
	if p := strings.Split(path, "/"); len(p) == 8 && strings.HasPrefix(path, "/apis/networking.istio.io/") {
		return p[7] + "." + p[5]
	}
	return "<unknown>"
}

// EndpointFilter keeps the endpoints of Cluster, on Address and Port, in
// Status, when set.
type EndpointFilter struct {
	Address, Cluster, Status string
	Port                     int
}

// EndpointTable is `proxy-config endpoint` (the dump must have been asked
// with ?include_eds): one row per endpoint, sorted by cluster then address.
// A config dump has no outlier detection state: OUTLIER CHECK is OK.
func (d *Dump) EndpointTable(f EndpointFilter) Table {
	ed := d.Endpoints()
	clas := append(unpackEach[*endpointv3.ClusterLoadAssignment](ed.GetDynamicEndpointConfigs(), (*adminv3.EndpointsConfigDump_DynamicEndpointConfig).GetEndpointConfig),
		unpackEach[*endpointv3.ClusterLoadAssignment](ed.GetStaticEndpointConfigs(), (*adminv3.EndpointsConfigDump_StaticEndpointConfig).GetEndpointConfig)...)
	slices.SortStableFunc(clas, func(a, b *endpointv3.ClusterLoadAssignment) int {
		return cmp.Compare(a.GetClusterName(), b.GetClusterName())
	})
	t := Table{Header: []string{"ENDPOINT", "STATUS", "OUTLIER CHECK", "CLUSTER"}}
	for _, cla := range clas {
		if f.Cluster != "" && cla.GetClusterName() != f.Cluster {
			continue
		}
		var rows [][]string
		for _, locality := range cla.GetEndpoints() {
			for _, lb := range locality.GetLbEndpoints() {
				sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
				addr := lb.GetEndpoint().GetAddress().GetPipe().GetPath()
				if sa != nil {
					addr = fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue())
				}
				status := lb.GetHealthStatus()
				if status == corev3.HealthStatus_UNKNOWN {
					status = corev3.HealthStatus_HEALTHY // Envoy routes to an endpoint of unknown health
				}
				if (f.Address != "" && sa.GetAddress() != f.Address) || (f.Port != 0 && int(sa.GetPortValue()) != f.Port) ||
					(f.Status != "" && !strings.EqualFold(status.String(), f.Status)) {
					continue
				}
				rows = append(rows, []string{addr, status.String(), "OK", cla.GetClusterName()})
			}
		}
		slices.SortStableFunc(rows, func(a, b []string) int { return cmp.Compare(a[0], b[0]) })
		t.Rows = append(t.Rows, rows...)
		if len(rows) > 0 {
			t.Resources = append(t.Resources, cla)
		}
	}
	return t
}

// SecretTable is `proxy-config secret`: the active, then warming, then static
// secrets; for a certificate or a CA bundle the first certificate's
// serial and validity, and whether it is valid at now.
func (d *Dump) SecretTable(now time.Time) Table {
	t := Table{Header: []string{"RESOURCE NAME", "TYPE", "STATUS", "VALID CERT", "SERIAL NUMBER", "NOT AFTER", "NOT BEFORE"}}
	sd := d.Secrets()
	add := func(name, status string, a *anypb.Any, entry proto.Message) {
		s := unpack[*tlsv3.Secret](a)
		kind, pemBytes := "", []byte(nil)
		switch {
		case s.GetTlsCertificate() != nil:
			kind, pemBytes = "Cert Chain", dataSource(s.GetTlsCertificate().GetCertificateChain())
		case s.GetValidationContext() != nil:
			kind, pemBytes = "CA", dataSource(s.GetValidationContext().GetTrustedCa())
		}
		row := []string{name, kind, status, "false", "", "", ""}
		if c := firstCertificate(pemBytes); c != nil {
			row[3] = strconv.FormatBool(!now.Before(c.NotBefore) && !now.After(c.NotAfter))
			row[4] = c.SerialNumber.Text(16)
			row[5], row[6] = c.NotAfter.UTC().Format(time.RFC3339), c.NotBefore.UTC().Format(time.RFC3339)
		}
		t.Rows = append(t.Rows, row)
		t.Resources = append(t.Resources, entry)
	}
	for _, s := range sd.GetDynamicActiveSecrets() {
		add(s.GetName(), "ACTIVE", s.GetSecret(), s)
	}
	for _, s := range sd.GetDynamicWarmingSecrets() {
		add(s.GetName(), "WARMING", s.GetSecret(), s)
	}
	for _, s := range sd.GetStaticSecrets() {
		add(s.GetName(), "ACTIVE", s.GetSecret(), s)
	}
	return t
}

// dataSource is the inline bytes of a data source (a real Envoy dumps a
// file-backed one by its path only).
func dataSource(ds *corev3.DataSource) []byte {
	if b := ds.GetInlineBytes(); b != nil {
		return b
	}
	return []byte(ds.GetInlineString())
}

func firstCertificate(pemBytes []byte) *x509.Certificate {
	for {
		var block *pem.Block
		block, pemBytes = pem.Decode(pemBytes)
		if block == nil {
			return nil
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil
		}
		return c
	}
}
