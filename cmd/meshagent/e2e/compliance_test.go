package e2e

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

// handshakeRecorder is a TLS server standing for the CA: it records how
// the first handshake of each connection ended, as the server saw it
// (version, key exchange and suite, or the error), and answers nothing.
type handshakeRecorder struct {
	addr string
	seen chan string
}

func recordHandshakes(t *testing.T, ca *pki.CA, curves []tls.CurveID) *handshakeRecorder {
	t.Helper()
	conf := ca.ServerTLS(t, "127.0.0.1")
	conf.CurvePreferences = curves
	conf.NextProtos = []string{"h2"} // gRPC's ALPN
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	r := &handshakeRecorder{addr: ln.Addr().String(), seen: make(chan string, 64)}
	testkit.ServeConns(ln, func(c net.Conn) {
		tc := tls.Server(c, conf)
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		outcome := "refused"
		if err := tc.Handshake(); err == nil {
			st := tc.ConnectionState()
			outcome = fmt.Sprintf("%s %v %s", tls.VersionName(st.Version), st.CurveID, tls.CipherSuiteName(st.CipherSuite))
		}
		select {
		case r.seen <- outcome:
		default:
		}
	})
	return r
}

// first is the outcome of the first handshake after start; "" if none
// came.
func (r *handshakeRecorder) first() string {
	select {
	case o := <-r.seen:
		return o
	case <-time.After(30 * time.Second):
		return ""
	}
}

// COMPLIANCE_POLICY on the CA client, compared with Istio's own agent
// (#35): for each policy, against a CA with Go's defaults and one offering
// only classical key exchanges, the handshake each agent makes (as the CA
// sees it: version, key exchange, suite, or refused) is the same.
func TestCompliancePolicyAgainstIstio(t *testing.T) {
	istioAgent, err := e2ekit.IstioAgentBinary()
	if err != nil {
		t.Skip(err)
	}
	ca := pki.NewRoot(t, "compliance-ca")
	servers := map[string][]tls.CurveID{"default": nil, "classical-only": {tls.X25519, tls.CurveP256, tls.CurveP384}}
	for _, policy := range []string{"", "fips-140-2", "fips-140-3", "pqc"} {
		for server, curves := range servers {
			t.Run(fmt.Sprintf("policy=%q,server=%s", policy, server), func(t *testing.T) {
				outcome := map[bool]string{}
				for _, ours := range []bool{false, true} {
					rec := recordHandshakes(t, ca, curves)
					dir := testkit.ShortTempDir(t, "cp") // unix socket paths are limited
					testkit.WriteFile(t, filepath.Join(dir, "var/run/secrets/istio/root-cert.pem"), ca.CertPEM)
					testkit.WriteFile(t, filepath.Join(dir, "var/run/secrets/tokens/istio-token"), []byte("token"))
					ports := e2ekit.FreePorts(t, 2)
					args := []string{"proxy", "sidecar"}
					binary := istioAgent
					if ours {
						binary, args = e2ekit.AgentBinary, append(args, "--root", dir)
					}
					cmd := exec.Command(binary, args...)
					cmd.Dir = dir
					cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "DISABLE_ENVOY=true", "CLOUD_PLATFORM=none",
						"INSTANCE_IP=127.0.0.1", "POD_NAME=compliance", "POD_NAMESPACE=default", "SERVICE_ACCOUNT=default",
						"CA_ADDR=" + rec.addr, "COMPLIANCE_POLICY=" + policy,
						fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d,"proxyAdminPort":%d,"discoveryAddress":"127.0.0.1:1","controlPlaneAuthPolicy":"NONE"}`,
							ports[0], ports[1])}
					log := &testkit.LogBuffer{}
					cmd.Stdout = log // Istio's agent logs there
					(&e2ekit.AgentProcess{Cmd: cmd, Stderr: log, Exited: make(chan error, 1)}).Start(t)
					if outcome[ours] = rec.first(); outcome[ours] == "" {
						who := map[bool]string{false: "Istio's agent", true: "meshagent"}[ours]
						t.Fatalf("%s never dialed the CA:\n%s", who, e2ekit.Tail(log.String(), 30))
					}
				}
				if outcome[false] != outcome[true] {
					t.Errorf("the CA saw Istio's agent: %s; meshagent: %s", outcome[false], outcome[true])
				}
				t.Logf("both: %s", outcome[true])
			})
		}
	}
}
