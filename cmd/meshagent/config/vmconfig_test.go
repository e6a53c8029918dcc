package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// A cluster.env as istioctl writes it, with what people add by hand.
const sampleClusterEnv = `# written by istioctl x workload entry configure
CANONICAL_REVISION='latest'
CANONICAL_SERVICE='vm-app'
ISTIO_INBOUND_PORTS='*'

ISTIO_LOCAL_EXCLUDE_PORTS='15090,15021,15020'
ISTIO_METAJSON_LABELS='{"app":"vm-app","service.istio.io/canonical-name":"vm-app"}'
ISTIO_META_CLUSTER_ID="Kubernetes"
ISTIO_META_MESH_ID=''
export ISTIO_NAMESPACE=vm-ns
ISTIO_SERVICE="vm-app.vm-ns" # the service
ESCAPED="a \"quoted\" \$word"
ISTIO_SERVICE_CIDR='*'
ISTIO_SERVICE_CIDR='10.0.0.0/8'
`

func writeEnvFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cluster.env")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadEnvFileReadsIstioctlsClusterEnv(t *testing.T) {
	vars, err := readEnvFile(writeEnvFile(t, sampleClusterEnv))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"CANONICAL_REVISION":    "latest",
		"ISTIO_INBOUND_PORTS":   "*",
		"ISTIO_METAJSON_LABELS": `{"app":"vm-app","service.istio.io/canonical-name":"vm-app"}`,
		"ISTIO_META_CLUSTER_ID": "Kubernetes",
		"ISTIO_META_MESH_ID":    "",
		"ISTIO_NAMESPACE":       "vm-ns",
		"ISTIO_SERVICE":         "vm-app.vm-ns",
		"ESCAPED":               `a "quoted" $word`,
		"ISTIO_SERVICE_CIDR":    "10.0.0.0/8", // the later line wins, as in a shell
	}
	for k, v := range want {
		if vars[k] != v {
			t.Errorf("%s = %q, want %q", k, vars[k], v)
		}
	}
	if len(vars) != 11 {
		t.Errorf("%d variables, want 11: %v", len(vars), vars)
	}
}

// What a shell would expand or choke on is refused, naming file:line,
// never read as a different value than bash would see.
func TestReadEnvFileRefusesWhatOnlyAShellUnderstands(t *testing.T) {
	for _, line := range []string{
		"NOEQUALS",
		"1BAD=x",
		"A=$HOME",
		`A="$(id)"`,
		"A=`id`",
		"A='unterminated",
		`A="unterminated`,
		"A='x' trailing",
		"A=x;reboot",
	} {
		p := writeEnvFile(t, "# comment\nGOOD='1'\n"+line+"\n")
		_, err := readEnvFile(p)
		if err == nil || !strings.Contains(err.Error(), p+":3:") {
			t.Errorf("%q: error %v, want one naming %s:3", line, err, p)
		}
	}
}

// As istio-start.sh: the files win over the process environment, and the
// script's defaults fill what neither sets.
func TestVMEnvironmentFilesWinThenIstioStartDefaults(t *testing.T) {
	for _, tc := range []struct {
		name             string
		cluster, sidecar string            // cluster.env and sidecar.env ("": none)
		env              map[string]string // the process's environment
		want             map[string]string
	}{
		{"the files win over the environment",
			"ISTIO_NAMESPACE='vm-ns'\nISTIO_SERVICE='vm-app'\nPILOT_ADDRESS='istiod.example:15012'\nPOD_NAME='from-file'\n",
			"ISTIO_SERVICE='from-sidecar-env'\nISTIO_CP_AUTH='NONE'\n",
			map[string]string{"POD_NAME": "from-env", "OUTPUT_CERTS": "/out"},
			map[string]string{
				"POD_NAME":      "from-file",
				"POD_NAMESPACE": "vm-ns",
				"CA_ADDR":       "istiod.example:15012",
				"PROV_CERT":     "/etc/certs",
				"OUTPUT_CERTS":  "/out",
				"PROXY_CONFIG":  "serviceCluster: vm-app\ncontrolPlaneAuthPolicy: NONE\ndiscoveryAddress: istiod.example:15012\n",
			}},
		{"the script's defaults fill the rest",
			"ISTIO_SYSTEM_NAMESPACE='mesh'\n", "",
			map[string]string{"POD_NAME": "from-env"},
			map[string]string{
				"POD_NAME":      "from-env",
				"POD_NAMESPACE": "default",
				"CA_ADDR":       "istiod.mesh.svc:15012",
				"PROXY_CONFIG":  "serviceCluster: rawvm\ncontrolPlaneAuthPolicy: MUTUAL_TLS\n",
			}},
		{"the pod is named after the host (hostname -s)",
			"ISTIO_SYSTEM_NAMESPACE='mesh'\n", "", nil,
			map[string]string{"POD_NAME": "vm1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			flags := &VMFlags{clusterEnv: clusterEnvFile, sidecarEnv: "./none"}
			writeRootFile(t, root, clusterEnvFile, tc.cluster)
			if tc.sidecar != "" {
				writeRootFile(t, root, sidecarEnvFile, tc.sidecar)
				flags.sidecarEnv = sidecarEnvFile
			}
			host := Host{Env: MapEnvironment(tc.env), Hostname: func() (string, error) { return "vm1.example.com", nil }}
			env, err := vmEnvironment(root, flags, host, &Problems{})
			if err != nil {
				t.Fatal(err)
			}
			wantEnv(t, env, tc.want)
		})
	}
}

func wantEnv(t *testing.T, env *Reader, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got, _ := env.source().Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
}

// writeRootFile writes a file at an Istio path under root.
func writeRootFile(t *testing.T, root, rel, text string) {
	t.Helper()
	testkit.WriteFile(t, Rooted(root, rel), []byte(text))
}

// `meshagent vm` runs Envoy as the proxy user: Envoy's sockets (XDS and
// SDS) are chowned to it; with ISTIO_CUSTOM_IP_TABLES (NoCapture) there is
// no capture service.
func TestEnvoyRunAsOwnsTheSockets(t *testing.T) {
	runAs := &envoy.Credential{UID: 1337, GID: 1337}
	cfg, err := parseWith(t, testHost(t, nil), func(in *Inputs) { in.EnvoyRunAs, in.NoCapture = runAs, true }, "--root", testRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tree.Envoy.RunAs == nil || cfg.Tree.XDS.SocketOwner.UID != 1337 || cfg.Tree.XDS.SocketOwner.GID != 1337 ||
		cfg.Tree.SDS.SocketOwner.UID != 1337 || cfg.Tree.SDS.SocketOwner.GID != 1337 {
		t.Fatalf("Envoy as %+v; XDS socket %d:%d, SDS socket %d:%d; want all 1337", cfg.Tree.Envoy.RunAs,
			cfg.Tree.XDS.SocketOwner.UID, cfg.Tree.XDS.SocketOwner.GID, cfg.Tree.SDS.SocketOwner.UID, cfg.Tree.SDS.SocketOwner.GID)
	}
	if cfg.Tree.Capture != nil {
		t.Fatal("ISTIO_CUSTOM_IP_TABLES=true (NoCapture) still has a capture service")
	}
}

// A VM's files where Istio's bundle puts them, under --root: the defaults
// of ISTIO_CLUSTER_CONFIG and ISTIO_SIDECAR_CONFIG (`meshagent help env`).
const (
	clusterEnvFile = "./var/lib/istio/envoy/cluster.env"
	sidecarEnvFile = "./var/lib/istio/envoy/sidecar.env"
)

// A bad value of istio-start.sh's variables names the variable (#32), not
// what the agent derived from it (discoveryAddress, INSTANCE_IP).
func TestVMBadValuesNameTheirVariable(t *testing.T) {
	root := t.TempDir()
	writeRootFile(t, root, clusterEnvFile, "ISTIO_PILOT_PORT=abc\nISTIO_SVC_IP=10.0.0\n")
	p := &Problems{}
	if _, err := ReadVM(root, &VMFlags{clusterEnv: clusterEnvFile, sidecarEnv: "./none"}, Host{Env: MapEnvironment(nil)}, p); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`ISTIO_PILOT_PORT="abc": want a port`, `ISTIO_SVC_IP="10.0.0": want an IP address`} {
		if p.Err() == nil || !strings.Contains(p.Err().Error(), want) {
			t.Errorf("problems %v; want %q", p.Err(), want)
		}
	}
}
