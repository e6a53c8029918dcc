package config

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// TestExternalSDSServerGetsFilesCluster: with a live SDS server (SPIRE's
// agent) on the workload socket, the agent runs no CA client, serves file
// secrets on its own socket, and Envoy's bootstrap names that socket in an
// sds-files-grpc cluster with file-credential metadata, as Istio's does.
func TestExternalSDSServerGetsFilesCluster(t *testing.T) {
	root := testRoot(t)
	env := map[string]string{"POD_NAME": "app-0", "POD_NAMESPACE": "ns", "INSTANCE_IP": "10.1.2.3"}

	cfg, err := parseForTest(t, env, "--root", root)
	if err != nil {
		t.Fatal(err)
	}
	_, data, _ := writeEnvoyBootstrap(t, cfg)
	if strings.Contains(data, "sds-files-grpc") || strings.Contains(data, "file-credential") {
		t.Fatal("no external SDS server, yet the bootstrap has the files-only SDS cluster")
	}

	xdsserver.ExternalSDS(t, filepath.Join(root, "var/run/secrets/workload-spiffe-uds/socket"))

	cfg, err = parseForTest(t, env, "--root", root)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tree.Certs != nil {
		t.Error("a CA client is configured although an external SDS server serves the identity")
	}
	_, data, _ = writeEnvoyBootstrap(t, cfg)
	files := filepath.Join(root, "var/run/secrets/credential-uds/files-socket")
	testkit.Contains(t, "bootstrap with an external SDS server", data, `"sds-files-grpc"`, files, `"file-credential": "true"`)
}

// ISTIOD_SAN names the CA too when the CA is the discovery address (no
// CA_ADDR), as in Istio's agent; an explicit CA_ADDR is checked by its
// own host.
func TestIstiodSANNamesTheCAAtTheDiscoveryAddress(t *testing.T) {
	env := map[string]string{"POD_NAME": "app-0", "POD_NAMESPACE": "ns", "INSTANCE_IP": "10.1.2.3",
		"PROXY_CONFIG": `{"discoveryAddress":"10.0.0.9:15012"}`, "ISTIOD_SAN": "istiod.istio-system.svc"}
	cfg, err := parseForTest(t, env, "--root", testRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Tree.Certs.CAServerName; got != "istiod.istio-system.svc" {
		t.Errorf("CA at the discovery address: server name %q, want ISTIOD_SAN's", got)
	}
	env["CA_ADDR"] = "10.0.0.9:15012"
	if cfg, err = parseForTest(t, env, "--root", testRoot(t)); err != nil {
		t.Fatal(err)
	}
	if got := cfg.Tree.Certs.CAServerName; got != "" {
		t.Errorf("explicit CA_ADDR: server name %q, want none (its host)", got)
	}
}

// The CA's TLS is verified with the root Istio's FindRootCAForCA picks:
// CA_ROOT_CA, else PROV_CERT's root-cert.pem (a VM's /etc/certs), else
// the Kubernetes configmap's.
func TestCARootIsIstios(t *testing.T) {
	root := testRoot(t)
	for _, c := range []struct {
		Env  map[string]string
		want string
	}{
		{nil, "var/run/secrets/istio/root-cert.pem"},
		{map[string]string{"PROV_CERT": "/etc/certs"}, "etc/certs/root-cert.pem"},
		{map[string]string{"PROV_CERT": "/etc/certs", "CA_ROOT_CA": "/ca/root.pem"}, "ca/root.pem"},
	} {
		cfg, err := parseForTest(t, c.Env, "--root", root)
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(root, c.want); cfg.Tree.Certs.CARootFile != want {
			t.Errorf("%v: CA root %s, want %s", c.Env, cfg.Tree.Certs.CARootFile, want)
		}
	}
}

// PROV_CERT's cert-chain.pem and key.pem are the client certificate to the
// CA and to istiod (Istio's GetKeyCertsForCA, GetKeyCertsForXDS): how a VM
// renews once its onboarding token has expired. Without PROV_CERT the CA
// sees none, and istiod the file-mounted certificate, if any.
func TestProvCertIsTheClientCertificate(t *testing.T) {
	root := testRoot(t)
	cfg, err := parseForTest(t, map[string]string{"PROV_CERT": "/etc/certs"}, "--root", root)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(root, "etc/certs")
	if got := cfg.Tree.Certs.ProvCertDir; got != want {
		t.Errorf("the CA client's certificate directory %q, want %q", got, want)
	}
	if got := cfg.Tree.XDS.ProvCertDir; got != want || cfg.Tree.XDS.ClientCertificate {
		t.Errorf("the XDS proxy's certificate: directory %q, bundle %t; want %q and not the bundle", got, cfg.Tree.XDS.ClientCertificate, want)
	}

	cfg, err = parseForTest(t, nil, "--root", root)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tree.Certs.ProvCertDir != "" || cfg.Tree.XDS.ProvCertDir != "" || cfg.Tree.XDS.ClientCertificate {
		t.Errorf("no PROV_CERT: CA client %q, XDS proxy %q / bundle %t; want no client certificate",
			cfg.Tree.Certs.ProvCertDir, cfg.Tree.XDS.ProvCertDir, cfg.Tree.XDS.ClientCertificate)
	}
}
