package controlplane

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sampleMesh = "../../testdata/standalone/mesh.yaml"

// parseMesh is the mesh a test writes inline; it must parse.
func parseMesh(t *testing.T, yaml string) Mesh {
	t.Helper()
	m, err := ParseMesh([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestSampleMeshParses(t *testing.T) {
	m, _, err := ReadMeshFile(sampleMesh)
	if err != nil {
		t.Fatal(err)
	}
	if m.Domain != "cluster.local" || len(m.Services) != 2 || len(m.ExternalNames) != 1 {
		t.Fatalf("sample mesh = %+v", m)
	}
	ratings := m.Services[1]
	if ratings.FQDN(m.Domain) != "ratings.default.svc.cluster.local" || len(ratings.Ports) != 2 ||
		ratings.Ports[1].Protocol != GRPC || len(ratings.Ports[0].Endpoints) != 2 {
		t.Fatalf("ratings = %+v", ratings)
	}
	if e := m.ExternalNames[0]; e.Host != "api.example.com" || len(e.IPs) != 1 || e.IPs[0].Text != "240.240.0.10" {
		t.Fatalf("external name = %+v", e)
	}
}

// serviceA is a mesh of one service, a.ns at 10.0.0.1, before its ports.
const serviceA = "services:\n  - name: a\n    namespace: ns\n    vip: 10.0.0.1\n"

func TestMeshDefaultsAndProtocolCase(t *testing.T) {
	m := parseMesh(t, serviceA+"    ports: [{port: 80, protocol: HTTP}]\n")
	if m.Domain != DefaultDomain || m.Services[0].Ports[0].Protocol != HTTP || len(m.Services[0].Ports[0].Endpoints) != 0 {
		t.Fatalf("mesh = %+v", m)
	}
}

// Every rejection names what is wrong and, where the file has it, the line.
func TestMeshErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"empty", "  \n", []string{"empty"}},
		{"syntax", "services: [\n", []string{"line"}},
		{"unknown top field", "servics: []\n", []string{"line 1", "servics"}},
		{"unknown port field", serviceA + "    ports: [{port: 80, protocl: http}]\n", []string{"line 5", `"protocl"`}},
		{"unknown service field", serviceA + "    port: 80\n", []string{"line 5", `"port"`}},
		{"port not a number", serviceA + "    ports: [{port: http, protocol: http}]\n", []string{"line 5"}},
		{"bad name", "services:\n  - name: A_b\n    namespace: ns\n    vip: 10.0.0.1\n    ports: [{port: 80, protocol: http}]\n", []string{"line 2", "DNS label"}},
		{"bad vip", "services:\n  - name: a\n    namespace: ns\n    vip: 10.0.0.300\n    ports: [{port: 80, protocol: http}]\n", []string{"line 4", `"10.0.0.300"`}},
		{"no ports", serviceA, []string{"line 2", "no ports"}},
		{"no protocol", serviceA + "    ports: [{port: 80}]\n", []string{"line 5", "protocol is required"}},
		{"unknown protocol", serviceA + "    ports: [{port: 80, protocol: udp}]\n", []string{"line 5", `"udp"`}},
		{"port range", serviceA + "    ports: [{port: 70000, protocol: http}]\n", []string{"line 5", "1-65535"}},
		{"capture port", serviceA + "    ports: [{port: 15001, protocol: tcp}]\n", []string{"line 5", "capture"}},
		{"duplicate port", serviceA + "    ports: [{port: 80, protocol: http}, {port: 80, protocol: http}]\n", []string{"twice"}},
		{"endpoint host name", serviceA + "    ports:\n      - port: 80\n        protocol: http\n        endpoints: [localhost:8080]\n", []string{"line 8", `"localhost:8080"`, "ip:port"}},
		{"endpoint without port", serviceA + "    ports:\n      - port: 80\n        protocol: http\n        endpoints: [127.0.0.1]\n", []string{"line 8", "ip:port"}},
		{"duplicate service", serviceA + "    ports: [{port: 80, protocol: http}]\n" +
			"  - name: a\n    namespace: ns\n    vip: 10.0.0.2\n    ports: [{port: 81, protocol: http}]\n",
			[]string{"line 6", "already declared at line 2"}},
		{"duplicate vip", serviceA + "    ports: [{port: 80, protocol: http}]\n" +
			"  - name: b\n    namespace: ns\n    vip: 10.0.0.1\n    ports: [{port: 81, protocol: http}]\n",
			[]string{"line 6", "already used at line 4"}},
		{"http and tcp on one port number", serviceA + "    ports: [{port: 80, protocol: http}]\n" +
			"  - name: b\n    namespace: ns\n    vip: 10.0.0.2\n    ports: [{port: 80, protocol: tcp}]\n",
			[]string{"line 9", "conflicts with service ns/a at line 5"}},
		{"external without ips", "externalNames: [{host: api.example.com}]\n", []string{"line 1", "no ips"}},
		{"external bad ip", "externalNames:\n  - host: api.example.com\n    ips: [nope]\n", []string{"line 3", `"nope"`}},
		{"external not qualified", "externalNames: [{host: api, ips: [1.2.3.4]}]\n", []string{"fully qualified"}},
		{"external clashes with a service", serviceA + "    ports: [{port: 80, protocol: http}]\n" +
			"externalNames: [{host: a.ns.svc.cluster.local, ips: [1.2.3.4]}]\n", []string{"line 6", "already declared at line 2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseMesh([]byte(tc.yaml))
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrBadMesh) {
				t.Errorf("%v does not wrap ErrBadMesh", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestReadMeshFileNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(path, []byte("services: 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := ReadMeshFile(path)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("error = %v, want the file and the line", err)
	}
	_, _, err = ReadMeshFile(filepath.Join(t.TempDir(), "missing.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v, want os.ErrNotExist", err)
	}
}
