// Command floor is the memory floor of `make bench-vs-istio` (#36): the
// least a Go sidecar agent holds at idle, run beside both agents as the
// start storm's floor proxy is (bench/kube-storm). It is a bench part, never
// shipped, and does only what the bench's idle window asks of an agent,
// with the libraries both agents use (grpc-go, go-control-plane's types,
// client_golang):
//
//   - it writes a bootstrap and runs Envoy (the stand-in) as its child;
//   - it proxies Envoy's ADS stream to the control plane, one upstream
//     stream per Envoy stream, each message passed on as it comes;
//   - it serves SDS on Istio's socket, the certificate files as they are
//     (FILE_MOUNTED_CERTS), read when Envoy asks;
//   - on its status port it answers /healthz/ready from Envoy's /ready and
//     /stats/prometheus with its Go and process collectors (Istio's names)
//     followed by Envoy's exposition as it comes, compressed when asked;
//   - Envoy answers the kubelet's probe on its readiness listener, as
//     meshagent's Envoy does while the agent is ready.
//
// What it leaves out is every other job of an agent: the configuration
// table, a CA client and key, certificate rotation, the DNS proxy and name
// table, capture, health checks of applications, the xDS cache and its
// state, Wasm, hot restarts, restarts with backoff, the debug pages. So its
// idle memory is a floor under any Go agent with these libraries, not a
// rival: what a Go agent costs before it does anything an operator would
// choose it for.
//
// It reads the environment both agents read in the bench (PROXY_CONFIG's
// discoveryAddress, statusPort, proxyAdminPort and binaryPath;
// ENVOY_STATUS_PORT; POD_NAME, POD_NAMESPACE, INSTANCE_IP) and ignores its
// arguments (`proxy sidecar`), running in the pod's root as its cwd.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// The paths of Istio's sidecar, under the cwd (the bench's pod root).
const (
	xdsSocket   = "etc/istio/proxy/XDS"
	sdsSocket   = "var/run/secrets/workload-spiffe-uds/socket"
	bootstrapAt = "etc/istio/proxy/envoy-rev.json"
	certsDir    = "etc/certs"
)

// config is what the floor reads from the environment.
type config struct {
	Discovery    string `json:"discoveryAddress"`
	StatusPort   int    `json:"statusPort"`
	AdminPort    int    `json:"proxyAdminPort"`
	BinaryPath   string `json:"binaryPath"`
	EnvoyStatus  int    `json:"-"`
	NodeID       string `json:"-"`
	ClusterName  string `json:"-"`
	Root         string `json:"-"`
	InstanceIP   string `json:"-"`
	PodNamespace string `json:"-"`
}

// gcPercent is meshagent's GC target (cmd/meshagent/memory.go), so that
// the floor and the agent differ in what they hold, not in how often they
// collect; GOGC in the environment still wins.
const gcPercent = 50

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	if err := run(); err != nil {
		log.Error("floor stopped", "error", err)
		os.Exit(1)
	}
}

func readConfig() (config, error) {
	var c config
	if err := json.Unmarshal([]byte(os.Getenv("PROXY_CONFIG")), &c); err != nil {
		return c, fmt.Errorf("PROXY_CONFIG: %w", err)
	}
	if c.Discovery == "" || c.StatusPort == 0 || c.AdminPort == 0 || c.BinaryPath == "" {
		return c, errors.New("PROXY_CONFIG: discoveryAddress, statusPort, proxyAdminPort and binaryPath are required")
	}
	port, err := strconv.Atoi(os.Getenv("ENVOY_STATUS_PORT"))
	if err != nil {
		return c, fmt.Errorf("ENVOY_STATUS_PORT: %w", err)
	}
	c.EnvoyStatus = port
	c.InstanceIP, c.PodNamespace = os.Getenv("INSTANCE_IP"), os.Getenv("POD_NAMESPACE")
	c.NodeID = fmt.Sprintf("sidecar~%s~%s.%s~%s.svc.cluster.local", c.InstanceIP, os.Getenv("POD_NAME"), c.PodNamespace, c.PodNamespace)
	c.ClusterName = "istio-proxy." + c.PodNamespace
	if c.Root, err = os.Getwd(); err != nil {
		return c, err
	}
	return c, nil
}

func run() error {
	c, err := readConfig()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	upstream, err := grpc.NewClient(c.Discovery,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}))
	if err != nil {
		return fmt.Errorf("control plane %s: %w", c.Discovery, err)
	}
	defer upstream.Close()

	xds, err := listenUnix(filepath.Join(c.Root, xdsSocket))
	if err != nil {
		return err
	}
	xdsServer := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(xdsServer, &adsProxy{upstream: discoveryv3.NewAggregatedDiscoveryServiceClient(upstream)})
	go xdsServer.Serve(xds)
	defer xdsServer.Stop()

	sds, err := listenUnix(filepath.Join(c.Root, sdsSocket))
	if err != nil {
		return err
	}
	sdsServer := grpc.NewServer()
	secretv3.RegisterSecretDiscoveryServiceServer(sdsServer, &secrets{dir: filepath.Join(c.Root, certsDir)})
	go sdsServer.Serve(sds)
	defer sdsServer.Stop()

	status, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.StatusPort)))
	if err != nil {
		return fmt.Errorf("status port: %w", err)
	}
	handler, err := newStatus(c.AdminPort)
	if err != nil {
		return err
	}
	statusServer := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go statusServer.Serve(status)
	defer statusServer.Close()

	envoy, err := startEnvoy(c)
	if err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- envoy.Wait() }()
	select {
	case err := <-exited:
		return fmt.Errorf("envoy exited: %v", err)
	case <-ctx.Done():
		_ = envoy.Process.Signal(syscall.SIGTERM)
		<-exited
		return nil
	}
}

func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	_ = os.Remove(path)
	return net.Listen("unix", path)
}

// startEnvoy writes the bootstrap and starts Envoy with the flags both
// agents pass, ended with the floor (Pdeathsig).
func startEnvoy(c config) (*exec.Cmd, error) {
	path := filepath.Join(c.Root, bootstrapAt)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, bootstrap(c), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(c.BinaryPath, "-c", path, "--drain-time-s", "45", "--drain-strategy", "immediate",
		"--local-address-ip-version", "v4", "--file-flush-interval-msec", "1000", "--disable-hot-restart",
		"--allow-unknown-static-fields", "--log-format", "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t", "-l", "warning")
	cmd.Dir, cmd.Stdout, cmd.Stderr = c.Root, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("envoy %s: %w", c.BinaryPath, err)
	}
	return cmd, nil
}

// bootstrap is Istio's sidecar bootstrap cut to what the idle window uses:
// the admin port, the readiness listener answering itself, delta ADS over
// the XDS socket, and the sds-grpc cluster istiod's secrets name.
func bootstrap(c config) []byte {
	pipe := func(name, path string) string {
		return fmt.Sprintf(`{"name": %q, "type": "STATIC", "connect_timeout": "1s",
  "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
    "explicit_http_config": {"http2_protocol_options": {}}}},
  "load_assignment": {"cluster_name": %q, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": %q}}}}]}]}}`,
			name, name, filepath.Join(c.Root, path))
	}
	return fmt.Appendf(nil, `{
 "node": {"id": %q, "cluster": %q, "metadata": {"NAMESPACE": %q, "INSTANCE_IPS": %q}},
 "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": %d}}},
 "dynamic_resources": {
  "ads_config": {"api_type": "DELTA_GRPC", "transport_api_version": "V3", "set_node_on_first_message_only": true,
   "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}]},
  "cds_config": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"},
  "lds_config": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"}},
 "static_resources": {
  "clusters": [%s, %s],
  "listeners": [{"name": "0.0.0.0_%d", "address": {"socket_address": {"address": "0.0.0.0", "port_value": %d}},
   "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
    "stat_prefix": "agent",
    "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
    "route_config": {"virtual_hosts": [{"name": "backend", "domains": ["*"], "routes": [
     {"match": {"prefix": "/healthz/ready"}, "direct_response": {"status": 200, "body": {"inline_string": "ready\n"}}}]}]}}}]}]}]}
}
`, c.NodeID, c.ClusterName, c.PodNamespace, c.InstanceIP, c.AdminPort,
		pipe("xds-grpc", xdsSocket), pipe("sds-grpc", sdsSocket), c.EnvoyStatus, c.EnvoyStatus)
}

// envoyGet asks Envoy's admin interface for path, for as long as ctx
// (the caller's request) lasts and the client's timeout allows.
func envoyGet(ctx context.Context, client *http.Client, adminPort int, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", adminPort, path), nil)
	if err != nil {
		return nil, err
	}
	return client.Do(req)
}
