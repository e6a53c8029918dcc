package e2e

// The parts of TestIstiodEndToEnd that are Istio's: the istiod peer
// (../shared/peers/istiod: Istio's own istiod without Kubernetes, and
// jwtlocal minting the service-account token its CA checks) run from a
// temp copy of its run/ directory, istiod's own view of what it pushed to
// a proxy (/debug/config_dump, /debug/syncz), and what the stand-in Envoy
// holds. The test runs in a network and mount namespace of its own: istiod
// and the agents use fixed ports, and the DNS proxies read the namespace's
// /etc/resolv.conf.

import (
	"encoding/json"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/envoyadmin"
)

const (
	// istiodNetnsEnv marks the re-run of the test binary inside the
	// namespace; its value is the resolv.conf bound over /etc/resolv.conf.
	istiodNetnsEnv = "MESHAGENT_ISTIOD_NETNS"
	// istiodDebug is istiod-local's debug HTTP server.
	istiodDebug = "http://127.0.0.1:18080"
	// istiodProxyID is how istiod names the pod both agents run as.
	istiodProxyID = "pod-0.ns"
)

// Type URLs of what istiod pushes to a sidecar.
const (
	typeURLCluster  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	typeURLListener = "type.googleapis.com/envoy.config.listener.v3.Listener"
	typeURLRoute    = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	typeURLEndpoint = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
	typeURLSecret   = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
)

// istiodPeerPaths finds the peer's binaries (MESHAGENT_ISTIOD_DIR, default
// the cache build.sh writes) and its run/ directory (MESHAGENT_ISTIOD_RUN,
// default ../shared/peers/istiod/run beside the checkout). It skips only
// when the test cannot run at all (not root); as root a missing peer fails
// the test, since `make test` builds every peer (#20: a fresh machine's
// `make test` skipped it without a word).
func istiodPeerPaths(t *testing.T) (bin, run string) {
	t.Helper()
	if ok, why := e2ekit.CanUseNetns(); !ok {
		t.Skip(why + ": istiod and the agents use fixed ports, so the test runs in its own network namespace")
	}
	bin = os.Getenv("MESHAGENT_ISTIOD_DIR")
	if bin == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			t.Fatalf("no cache directory for the istiod peer: %v", err)
		}
		bin = filepath.Join(cache, "meshagent-peers", "istiod")
	}
	for _, name := range []string{"istiod-local", "jwtlocal"} {
		if fi, err := os.Stat(filepath.Join(bin, name)); err != nil || fi.Mode()&0o111 == 0 {
			t.Fatalf("the istiod peer is not built (%s missing; `make test`, `make peers` or `make e2e-istiod` builds it, or set MESHAGENT_ISTIOD_DIR)", filepath.Join(bin, name))
		}
	}
	candidates := []string{os.Getenv("MESHAGENT_ISTIOD_RUN")}
	if os.Getenv("MESHAGENT_ISTIOD_RUN") == "" {
		// cmd/meshagent/e2e of a checkout beside shared/ (/work/main), or of
		// a worktree one level deeper (/work/wt/x).
		candidates = []string{"../../../../shared/peers/istiod/run", "../../../../../shared/peers/istiod/run"}
	}
	for _, c := range candidates {
		if fi, err := os.Stat(filepath.Join(c, "start-istiod-local.sh")); err == nil && !fi.IsDir() {
			abs, _ := filepath.Abs(c)
			return bin, abs
		}
	}
	t.Fatalf("the istiod peer's run/ directory is not found (set MESHAGENT_ISTIOD_RUN; tried %v)", candidates)
	return "", ""
}

// rerunInNamespace runs this test again, in the test binary, inside a new
// network and mount namespace (loopback up, resolv.conf naming a dead
// loopback resolver bound over /etc/resolv.conf), passes its log through,
// and reports whether it passed. The caller returns after it.
func rerunInNamespace(t *testing.T) {
	t.Helper()
	if ok, why := e2ekit.CanUseNetns(); !ok {
		t.Skip(why + ": istiod and the agents use fixed ports, so the test runs in its own network namespace")
	}
	dir := t.TempDir()
	resolv := filepath.Join(dir, "resolv.conf")
	// Nothing answers on 127.0.0.2:53 in the namespace: every name the
	// mesh does not know fails fast, and no query leaves the namespace.
	testkit.WriteFile(t, resolv, []byte("nameserver 127.0.0.2\nsearch ns.svc.cluster.local svc.cluster.local cluster.local\n"))
	script := `set -e; ip link set lo up; mount --bind "$0" /etc/resolv.conf; exec "$@"`
	cmd := exec.Command("unshare", "--net", "--mount", "--", "sh", "-c", script, resolv,
		os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.v", "-test.count=1", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), istiodNetnsEnv+"="+resolv, e2ekit.E2EBinDirEnv+"="+filepath.Dir(e2ekit.AgentBinary))
	out, err := cmd.CombinedOutput()
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		t.Log(line)
	}
	switch {
	case err != nil:
		t.Fatalf("the test in its namespace failed: %v", err)
	case strings.Contains(string(out), "--- SKIP"):
		t.Skip("skipped in its namespace (see above)")
	}
}

// istiodPeer is istiod-local and jwtlocal running from a temp copy of run/.
type istiodPeer struct {
	bin, dir string // the binaries; the copy of run/ (logs, cacerts, config)
	token    string // the service-account JWT jwtlocal minted
}

// startIstiodPeer does what the peer's demo.sh does: a plugged-in CA, the
// JWKS server and its token, istiod with JWT_RULE pointing at it.
func startIstiodPeer(t *testing.T, bin, run string) *istiodPeer {
	t.Helper()
	p := &istiodPeer{bin: bin, dir: testkit.ShortTempDir(t, "istiod")}
	copyTree(t, run, p.dir)
	p.sh(t, "./gen-ca.sh")
	p.token = filepath.Join(p.dir, "istio-token")
	jwt := exec.Command(filepath.Join(bin, "jwtlocal"), "-token", p.token, "-for", "30m")
	jwt.Dir = p.dir
	jwtLog := &testkit.LogBuffer{}
	jwt.Stdout, jwt.Stderr = jwtLog, jwtLog
	if err := jwt.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = jwt.Process.Kill(); _ = jwt.Wait() })
	testkit.WaitFor(t, "jwtlocal's JWKS on 127.0.0.1:18090", func() bool { return dialable("127.0.0.1:18090") })
	p.Start(t)
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(p.dir, "istiod.log"))
			t.Logf("istiod log (tail):\n%s", e2ekit.Tail(string(b), 60))
		}
	})
	return p
}

// start runs start-istiod-local.sh and waits until istiod serves xDS (its
// TLS port is open and the plaintext one answers a probe).
func (p *istiodPeer) Start(t *testing.T) {
	t.Helper()
	p.sh(t, "./start-istiod-local.sh")
	testkit.WaitFor(t, "istiod's ports 15010 and 15012", func() bool {
		return dialable("127.0.0.1:15012") && dialable("127.0.0.1:15010")
	})
}

// stop kills istiod and waits until it is gone (it is not our child: the
// script started it).
func (p *istiodPeer) stop(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.dir, "istiod.pid"))
	if err != nil {
		return
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	testkit.WaitFor(t, "istiod to exit", func() bool { return !alive(pid) || testkit.IsZombie(pid) })
	testkit.WaitFor(t, "istiod's port 15012 to close", func() bool { return !dialable("127.0.0.1:15012") })
}

func (p *istiodPeer) sh(t *testing.T, script string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(), "ISTIOD_BIN="+p.bin,
		`JWT_RULE={"issuer":"https://local-issuer.example","jwks_uri":"http://127.0.0.1:18090/jwks","audiences":["istio-ca"]}`)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// rootCert is the plugged-in root both agents trust.
func (p *istiodPeer) rootCert() string { return filepath.Join(p.dir, "cacerts", "root-cert.pem") }

// writeConfig writes an Istio config file into the directory istiod reads.
func (p *istiodPeer) writeConfig(t *testing.T, name, yaml string) {
	t.Helper()
	testkit.ReplaceFile(t, filepath.Join(p.dir, "config", name), []byte(yaml))
}

// pushed is what istiod says it pushed to the proxy, by type: its own
// /debug/config_dump for it (clusters, listeners, routes; the endpoints
// as the clusters' EDS names); nil while the proxy is not connected.
func (p *istiodPeer) pushed(t *testing.T) map[string][]string {
	t.Helper()
	var dump struct {
		Configs []map[string]json.RawMessage `json:"configs"`
	}
	code, body := e2ekit.HTTPGet(istiodDebug + "/debug/config_dump?proxyID=" + istiodProxyID)
	if code != http.StatusOK {
		return nil // not connected (yet, or any more)
	}
	if err := json.Unmarshal([]byte(body), &dump); err != nil {
		t.Fatalf("istiod's config_dump: %v\n%s", err, e2ekit.Tail(body, 20))
	}
	out := map[string][]string{}
	for _, c := range dump.Configs { // protojson: camelCase names
		for key, raw := range c {
			var items []map[string]json.RawMessage
			if json.Unmarshal(raw, &items) != nil {
				continue
			}
			for _, it := range items {
				switch key {
				case "dynamicActiveClusters":
					var c struct {
						Name             string `json:"name"`
						Type             string `json:"type"`
						EDSClusterConfig *struct {
							ServiceName string `json:"serviceName"`
						} `json:"edsClusterConfig"`
					}
					_ = json.Unmarshal(it["cluster"], &c)
					out[typeURLCluster] = append(out[typeURLCluster], c.Name)
					if c.Type == "EDS" {
						name := c.Name
						if c.EDSClusterConfig != nil && c.EDSClusterConfig.ServiceName != "" {
							name = c.EDSClusterConfig.ServiceName
						}
						out[typeURLEndpoint] = append(out[typeURLEndpoint], name)
					}
				case "dynamicListeners":
					var name string
					_ = json.Unmarshal(it["name"], &name)
					out[typeURLListener] = append(out[typeURLListener], name)
				case "dynamicRouteConfigs":
					var rc struct {
						Name string `json:"name"`
					}
					_ = json.Unmarshal(it["routeConfig"], &rc)
					out[typeURLRoute] = append(out[typeURLRoute], rc.Name)
				}
			}
		}
	}
	for _, names := range out {
		slices.Sort(names)
	}
	return out
}

// standIn is the stand-in Envoy's admin API on Envoy's admin port.
type standIn struct{ admin string }

// standInDump is the stand-in's /config_dump, Envoy's ConfigDump.
type standInDump struct{ *envoyadmin.Dump }

// Secret, Bootstrap and Names read the dump (package envoyadmin's).
func (d standInDump) Secret(name string) *tlsv3.Secret        { return d.Dump.Secret(name) }
func (d standInDump) Bootstrap() *adminv3.BootstrapConfigDump { return d.Dump.Bootstrap() }
func (d standInDump) Names() map[string][]string              { return envoyadmin.Names(d.Dump) }

func (e standIn) dump(t *testing.T) standInDump {
	t.Helper()
	d, err := envoyadmin.Decode([]byte(mustGet(t, e.admin+"/config_dump?include_eds")))
	if err != nil {
		t.Fatalf("the stand-in's config_dump: %v", err)
	}
	return standInDump{d}
}

// held is what the stand-in holds, by type, names sorted.
func (d standInDump) held() map[string][]string {
	names := d.Names()
	out := map[string][]string{}
	for _, typ := range []string{typeURLCluster, typeURLListener, typeURLRoute, typeURLEndpoint} {
		out[typ] = append([]string{}, names[typ]...)
		slices.Sort(out[typ])
	}
	return out
}

// stats are the stand-in's counters, by Envoy name.
func (e standIn) stats(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, line := range strings.Split(mustGet(t, e.admin+"/stats"), "\n") {
		name, v, ok := strings.Cut(line, ": ")
		if n, err := strconv.Atoi(v); ok && err == nil {
			out[name] = n
		}
	}
	return out
}

// copyTree copies run/ (read-only in shared/) writable, as demo.sh's cp.
func copyTree(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644|fi.Mode().Perm()&0o111)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func dialable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// mustGet is the body of a 200 answer to GET url.
func mustGet(t *testing.T, url string) string {
	t.Helper()
	code, body := e2ekit.HTTPGet(url)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d\n%s", url, code, e2ekit.Tail(body, 20))
	}
	return body
}

// shortLines cuts every line of s to n bytes (the agent's effective
// configuration is one long line).
func shortLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if len(l) > n {
			lines[i] = l[:n] + " [...]"
		}
	}
	return strings.Join(lines, "\n")
}

// syncedProxies are the proxies istiod's /debug/syncz lists, each with the
// types it has ACKed ("cluster_acked" and the like, non-empty).
func syncedProxies() map[string][]string {
	code, body := e2ekit.HTTPGet(istiodDebug + "/debug/syncz")
	var entries []map[string]any
	if code != http.StatusOK || json.Unmarshal([]byte(body), &entries) != nil {
		return nil
	}
	out := map[string][]string{}
	for _, e := range entries {
		proxy, _ := e["proxy"].(string)
		acked := []string{}
		for k, v := range e {
			if s, ok := v.(string); ok && strings.HasSuffix(k, "_acked") && s != "" {
				acked = append(acked, strings.TrimSuffix(k, "_acked"))
			}
		}
		slices.Sort(acked)
		out[proxy] = acked
	}
	return out
}
