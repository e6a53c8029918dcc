package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"

	"github.com/meshagent/meshagent/services/internal/boundedfile"
)

// ErrBadMesh: the mesh file does not describe a mesh we can serve. The error
// wrapping it names the file and, where it can, the line.
var ErrBadMesh = errors.New("bad mesh file")

// Mesh is the mesh file (testdata/standalone/mesh.yaml is the documented
// sample): a few Kubernetes-like services with their endpoints, and external
// names, from which the control plane generates what istiod would send a
// sidecar.
type Mesh struct {
	// Domain is the cluster's DNS suffix: a service's host name is
	// <name>.<namespace>.svc.<domain>. Default cluster.local.
	Domain        string         `yaml:"domain"`
	Services      []MeshService  `yaml:"services"`
	ExternalNames []ExternalName `yaml:"externalNames"`
}

// MeshService is a Kubernetes Service and its endpoints.
type MeshService struct {
	Name      string `yaml:"name"`
	Namespace string `yaml:"namespace"`
	// VIP is the cluster IP: what DNS answers for the service, and the
	// address a TCP port's outbound listener matches.
	VIP   Addr       `yaml:"vip"`
	Ports []MeshPort `yaml:"ports"`

	line int // where the service starts in the file, for errors
}

// MeshPort is one service port and the endpoints behind it.
type MeshPort struct {
	Port      uint32   `yaml:"port"`
	Protocol  Protocol `yaml:"protocol"`
	Endpoints []Addr   `yaml:"endpoints"` // ip:port each

	line int
}

// ExternalName is a name outside the cluster (a ServiceEntry with
// addresses, in Istio's terms): only DNS knows it, so the name table is the
// only thing generated from it; Envoy sends its traffic through
// PassthroughCluster like any unknown destination.
type ExternalName struct {
	Host string `yaml:"host"`
	IPs  []Addr `yaml:"ips"`

	line int
}

// Protocol is a port's protocol, as Istio names them (case does not matter).
type Protocol string

const (
	HTTP  Protocol = "http"
	HTTP2 Protocol = "http2"
	GRPC  Protocol = "grpc"
	TCP   Protocol = "tcp"
)

// isHTTP: the port gets an HTTP connection manager and a route
// configuration; otherwise a TCP proxy.
func (p Protocol) isHTTP() bool { return p != TCP }

// http2Upstream: Envoy must speak HTTP/2 to the endpoints.
func (p Protocol) http2Upstream() bool { return p == HTTP2 || p == GRPC }

// Addr is an IP address, or an ip:port, as written in the file; it keeps
// the line it came from so that a later check can point at it.
type Addr struct {
	Text string
	line int
}

// DefaultDomain is Kubernetes' default cluster domain.
const DefaultDomain = "cluster.local"

// reservedPorts are Envoy's capture listeners: a service port with the same
// number would be matched by virtualOutbound's blackhole chain.
var reservedPorts = map[uint32]string{15001: "outbound capture (virtualOutbound)", 15006: "inbound capture (virtualInbound)"}

// ReadMeshFile reads and checks the mesh file. Errors wrap ErrBadMesh (or
// the file system's error) and name the file and the line.
func ReadMeshFile(path string) (Mesh, []byte, error) {
	b, err := boundedfile.Read(path, boundedfile.MaxConfig)
	if err != nil {
		return Mesh{}, nil, fmt.Errorf("mesh file %s: %w", path, err)
	}
	m, err := ParseMesh(b)
	if err != nil {
		return Mesh{}, nil, fmt.Errorf("mesh file %s: %w", path, err)
	}
	return m, b, nil
}

// ParseMesh decodes and checks a mesh. Unknown fields are errors: a
// misspelt field silently ignored would serve a mesh the author did not
// write.
func ParseMesh(b []byte) (Mesh, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		// An empty file is most often a save in progress; serving an empty
		// mesh would wipe every route until the next write.
		return Mesh{}, fmt.Errorf("%w: the file is empty", ErrBadMesh)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var m Mesh
	if err := dec.Decode(&m); err != nil {
		if errors.Is(err, io.EOF) {
			return Mesh{}, fmt.Errorf("%w: no YAML document", ErrBadMesh)
		}
		// yaml lists several errors one per line; a health reason is one line.
		return Mesh{}, fmt.Errorf("%w: %s", ErrBadMesh, strings.ReplaceAll(err.Error(), "\n  ", " "))
	}
	if m.Domain == "" {
		m.Domain = DefaultDomain
	}
	if err := m.check(); err != nil {
		return Mesh{}, fmt.Errorf("%w: %v", ErrBadMesh, err)
	}
	return m, nil
}

// FQDN is the service's host name, as Kubernetes names it.
func (s MeshService) FQDN(domain string) string {
	return s.Name + "." + s.Namespace + ".svc." + domain
}

// dnsLabel is RFC 1123, as Kubernetes requires of names and namespaces.
// This and dnsName are compiled on first use: a sidecar never checks a
// mesh file, and a package-level regexp is live heap in every pod (#36).
var dnsLabel = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`) })

// dnsName is a host name of such labels, a leading "*." allowed.
var dnsName = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^(\*\.)?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
})

// check validates what the decoder cannot: names, addresses, and ports that
// would produce conflicting listeners.
func (m Mesh) check() error {
	if !dnsName().MatchString(m.Domain) {
		return fmt.Errorf("domain %q is not a DNS name", m.Domain)
	}
	hosts := map[string]int{}    // host → line, across services and external names
	vips := map[netip.Addr]int{} // VIP → line
	// A port number is one Envoy listener (0.0.0.0_<port> for HTTP, or one
	// per VIP for TCP): every service using the number must agree on which.
	type portUse struct {
		http    bool
		service string
		line    int
	}
	ports := map[uint32]portUse{}
	for _, s := range m.Services {
		at := fmt.Sprintf("line %d: service %q", s.line, s.Name)
		if !dnsLabel().MatchString(s.Name) {
			return fmt.Errorf("%s: name must be a DNS label (lower case letters, digits, '-')", at)
		}
		if !dnsLabel().MatchString(s.Namespace) {
			return fmt.Errorf("%s: namespace %q must be a DNS label (lower case letters, digits, '-')", at, s.Namespace)
		}
		at = fmt.Sprintf("line %d: service %s/%s", s.line, s.Namespace, s.Name)
		h := s.FQDN(m.Domain)
		if prev, dup := hosts[h]; dup {
			return fmt.Errorf("%s: host %s is already declared at line %d", at, h, prev)
		}
		hosts[h] = s.line
		vip, err := s.VIP.ip()
		if err != nil {
			return fmt.Errorf("%s: vip: %v", at, err)
		}
		if prev, dup := vips[vip]; dup {
			return fmt.Errorf("%s: vip %s is already used at line %d", at, vip, prev)
		}
		vips[vip] = s.VIP.line
		if len(s.Ports) == 0 {
			return fmt.Errorf("%s: no ports", at)
		}
		seen := map[uint32]bool{}
		for _, p := range s.Ports {
			pat := fmt.Sprintf("line %d: service %s/%s port %d", p.line, s.Namespace, s.Name, p.Port)
			if p.Port == 0 || p.Port > 65535 {
				return fmt.Errorf("%s: must be 1-65535", pat)
			}
			if why, reserved := reservedPorts[p.Port]; reserved {
				return fmt.Errorf("%s: reserved for Envoy's %s", pat, why)
			}
			if seen[p.Port] {
				return fmt.Errorf("%s: declared twice", pat)
			}
			seen[p.Port] = true
			switch p.Protocol {
			case HTTP, HTTP2, GRPC, TCP:
			case "":
				return fmt.Errorf("%s: protocol is required (http, http2, grpc or tcp)", pat)
			default:
				return fmt.Errorf("%s: protocol %q: want http, http2, grpc or tcp", pat, p.Protocol)
			}
			if u, used := ports[p.Port]; used && u.http != p.Protocol.isHTTP() {
				return fmt.Errorf("%s: protocol %s conflicts with service %s at line %d: one port number is either HTTP (http, http2, grpc) or tcp in the whole mesh", pat, p.Protocol, u.service, u.line)
			}
			ports[p.Port] = portUse{http: p.Protocol.isHTTP(), service: s.Namespace + "/" + s.Name, line: p.line}
			for _, e := range p.Endpoints {
				if _, err := e.ipPort(); err != nil {
					return fmt.Errorf("%s: endpoint: %v", pat, err)
				}
			}
		}
	}
	for _, e := range m.ExternalNames {
		at := fmt.Sprintf("line %d: external name %q", e.line, e.Host)
		if !dnsName().MatchString(e.Host) || !strings.Contains(e.Host, ".") {
			return fmt.Errorf("%s: host must be a fully qualified DNS name in lower case", at)
		}
		if prev, dup := hosts[e.Host]; dup {
			return fmt.Errorf("%s: host is already declared at line %d", at, prev)
		}
		hosts[e.Host] = e.line
		if len(e.IPs) == 0 {
			return fmt.Errorf("%s: no ips", at)
		}
		for _, a := range e.IPs {
			if _, err := a.ip(); err != nil {
				return fmt.Errorf("%s: %v", at, err)
			}
		}
	}
	return nil
}

// UnmarshalYAML keeps the line of each service, port and external name, so
// that the checks after decoding can name it.
func (s *MeshService) UnmarshalYAML(n *yaml.Node) error {
	type plain MeshService
	return decodeStrict(n, (*plain)(s), &s.line)
}

func (p *MeshPort) UnmarshalYAML(n *yaml.Node) error {
	type plain MeshPort
	if err := decodeStrict(n, (*plain)(p), &p.line); err != nil {
		return err
	}
	p.Protocol = Protocol(strings.ToLower(string(p.Protocol)))
	return nil
}

func (e *ExternalName) UnmarshalYAML(n *yaml.Node) error {
	type plain ExternalName
	return decodeStrict(n, (*plain)(e), &e.line)
}

// decodeStrict is n.Decode(v) refusing keys v has no field for (yaml's
// Node.Decode does not inherit the decoder's KnownFields, so a custom
// unmarshaler must check them itself), and records in *line where n
// starts.
func decodeStrict(n *yaml.Node, v any, line *int) error {
	if n.Kind == yaml.MappingNode {
		t := reflect.TypeOf(v).Elem()
		known := map[string]bool{}
		for i := range t.NumField() {
			if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag != "" && tag != "-" {
				known[tag] = true
			}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := n.Content[i]; !known[k.Value] {
				return fmt.Errorf("line %d: unknown field %q", k.Line, k.Value)
			}
		}
	}
	if err := n.Decode(v); err != nil {
		return err
	}
	*line = n.Line
	return nil
}

func (a *Addr) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want an address, got a %s", n.Line, kindName(n.Kind))
	}
	a.Text, a.line = n.Value, n.Line
	return nil
}

// ip parses an address written as a bare IP.
func (a Addr) ip() (netip.Addr, error) {
	ip, err := netip.ParseAddr(a.Text)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("line %d: %q is not an IP address", a.line, a.Text)
	}
	return ip.Unmap(), nil
}

// ipPort parses an endpoint written as ip:port ([ip6]:port).
func (a Addr) ipPort() (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(a.Text)
	if err != nil || ap.Port() == 0 {
		return netip.AddrPort{}, fmt.Errorf("line %d: %q is not ip:port (an IP address, not a host name, and a port 1-65535)", a.line, a.Text)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	case yaml.AliasNode:
		return "alias"
	}
	return "node of kind " + strconv.Itoa(int(k))
}
