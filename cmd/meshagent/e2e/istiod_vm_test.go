package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// A VM's agent renews with the certificate it was last issued once the
// token it was onboarded with is gone: PROV_CERT and OUTPUT_CERTS name the
// same directory, as istio-start.sh sets them, and on a VM /var/run is a
// tmpfs, so after a reboot there is no token at all. istiod's CA and its
// XDS server authenticate the agent by that certificate (their
// ClientCertAuthenticator comes before the JWT one). The first run, with
// the token, writes the certificate; the second, in the same directory
// without the token, gets a new one from istiod and turns ready. Before the
// agent presented PROV_CERT's certificate to the CA, the second run was
// refused (Unauthenticated) and never got a certificate.
func renewsByCertificate(t *testing.T, peer *istiodPeer, a istiodAgent) {
	root := testkit.ShortTempDir(t, "vm")
	writePodFiles(t, peer, a, root)
	// The onboarding bundle's root in the directory, as on a VM: Istio's
	// agent writes OUTPUT_CERTS into it and does not make it.
	meshRoot, err := os.ReadFile(peer.rootCert())
	if err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, filepath.Join(root, "vm-certs", "root-cert.pem"), meshRoot)
	env := []string{"PROV_CERT=./vm-certs", "OUTPUT_CERTS=./vm-certs"}
	written := filepath.Join(root, "vm-certs", "cert-chain.pem")
	var first []byte
	if !t.Run("with the token", func(t *testing.T) {
		p, _ := launchIn(t, a, root, env...)
		p.WaitStatus(t, "/healthz/ready", 200)
		testkit.WaitFor(t, "the certificate written to OUTPUT_CERTS", func() bool {
			first, _ = os.ReadFile(written)
			return len(first) > 0
		})
	}) {
		return
	}
	if err := os.Remove(filepath.Join(root, istioTokenFile)); err != nil {
		t.Fatal(err)
	}
	p, _ := launchIn(t, a, root, env...)
	p.WaitStatus(t, "/healthz/ready", 200)
	envoy := standIn{admin: "http://127.0.0.1:15000"}
	testkit.WaitFor(t, "a new workload certificate in Envoy, with no token", func() bool {
		s := envoy.dump(t).Secret("default")
		return s != nil && !bytes.Equal(s.GetTlsCertificate().GetCertificateChain().GetInlineBytes(), first)
	})
	if san := checkWorkloadCert(t, envoy.dump(t), peer.rootCert()); san != "spiffe://cluster.local/ns/ns/sa/default" {
		t.Errorf("the renewed certificate's SAN %q, want the workload's", san)
	}
}
