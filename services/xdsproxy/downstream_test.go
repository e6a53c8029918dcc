package xdsproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/services/internal/uds"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// openADS opens a raw State of the World stream on the proxy's socket.
func openADS(t *testing.T, socket string) discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(waitCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A request over maxRequestSize is refused with ResourceExhausted before
// it is read (issue #21: the socket took up to 2 GiB, and a 16 MiB
// request cost ~94 MiB); Envoy and the proxy carry on.
func TestOversizedRequestRefused(t *testing.T) {
	cp := servingControlPlane(t, "v1", 3)
	p := startProxy(t, testConfig(tempRoot(t), cp.Addr()), proxyOpts{})
	ctx := waitCtx(t)

	// Envoy's EDS request for ~80,000 clusters of 64-byte names.
	names := make([]string, maxRequestSize/64+1000)
	for i := range names {
		names[i] = fmt.Sprintf("outbound|8080||svc-%043d.default.svc.cluster.local", i)
	}
	big := openADS(t, p.cfg.SocketPath)
	err := big.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: testNode}, TypeUrl: resource.EndpointType, ResourceNames: names})
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	_, err = big.Recv()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a %d-name request got %v, want ResourceExhausted", len(names), err)
	}
	testkit.Contains(t, "the refusal", status.Convert(err).Message(), "larger than max", strconv.Itoa(maxRequestSize))
	// The proxy refused it, not the control plane it would have gone to.
	// (The reader logs after the stream has failed: wait for the line.)
	p.logs.WaitLine(t, "refused a request on the XDS socket: larger than the bound", "max_bytes="+strconv.Itoa(maxRequestSize))

	// The proxy still serves Envoy.
	envoy := p.clientWith(t, xdsserver.ClientOptions{})
	if err := envoy.WaitFor(ctx, bothTypes("v1", 3)); err != nil {
		t.Fatal(err)
	}
	snapshot(t, cp, "v2", 4)
	if err := envoy.WaitFor(ctx, bothTypes("v2", 4)); err != nil {
		t.Fatal(err)
	}
}

// SO_PEERCRED read on a real unix connection: this process's pid and uid.
func TestReadPeerCred(t *testing.T) {
	path := filepath.Join(tempRoot(t), "s")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := readPeerCred(s)
	if err != nil {
		t.Fatal(err)
	}
	if int(p.pid) != os.Getpid() || int(p.uid) != os.Geteuid() || int(p.gid) != os.Getegid() {
		t.Errorf("peer %+v, want pid %d uid %d gid %d", p, os.Getpid(), os.Geteuid(), os.Getegid())
	}
	if _, err := readPeerCred(&net.TCPConn{}); !errors.Is(err, errNoPeerCred) {
		t.Errorf("readPeerCred of a TCP connection: %v, want errNoPeerCred", err)
	}
}

func TestMayReplace(t *testing.T) {
	envoy := peerCred{pid: 10, uid: 1337}
	if err := mayReplace(envoy, peerCred{pid: 11, uid: 1337}); err != nil {
		t.Errorf("a newer Envoy of the same uid refused: %v", err)
	}
	err := mayReplace(envoy, peerCred{pid: 12, uid: 0})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("another uid: %v, want PermissionDenied", err)
	}
	testkit.Contains(t, "the refusal", err.Error(), "uid 1337 (pid 10)", "uid 0 (pid 12)")
}

// peerClientEnv, set to the XDS socket's path, makes this test binary a
// client that opens a stream there and prints how its first receive ends
// (TestMain): run under another uid, it is a local process that is not
// Envoy.
const peerClientEnv = "XDSPROXY_TEST_PEER_CLIENT"

func runPeerClient() int {
	conn, err := grpc.NewClient("unix://"+os.Getenv(peerClientEnv), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err == nil {
		err = st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: testNode}, TypeUrl: resource.ClusterType})
	}
	if err == nil || errors.Is(err, io.EOF) {
		_, err = st.Recv()
	}
	if err == nil {
		fmt.Println("response")
		return 0
	}
	fmt.Println(status.Code(err))
	return 0
}

// A local process of another uid that can reach the socket (here through
// its group) cannot cut Envoy's stream: its stream is refused with
// PermissionDenied, and the refusal is logged with both peers. A newer
// stream of Envoy's uid replaces the open one, logged likewise (issue #21).
func TestOtherUIDCannotReplaceEnvoysStream(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running a client under another uid needs root")
	}
	const otherUID, proxyGID = 2000, 1337
	cp := servingControlPlane(t, "v1", 3)
	root := tempRoot(t)
	// The other uid reaches the socket through Envoy's group, the
	// directories above it being open to all.
	for _, d := range []string{root, filepath.Join(root, "etc"), filepath.Join(root, "etc/istio")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testConfig(root, cp.Addr())
	cfg.SocketOwner = uds.Owner{UID: -1, GID: proxyGID}
	p := startProxy(t, cfg, proxyOpts{})
	ctx := waitCtx(t)
	envoy := p.clientWith(t, xdsserver.ClientOptions{})
	if err := envoy.WaitFor(ctx, bothTypes("v1", 3)); err != nil {
		t.Fatal(err)
	}

	// The test binary, where the other uid may run it.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "xdsproxy.test")
	testkit.InstallExecutable(t, self, bin)
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), peerClientEnv+"="+cfg.SocketPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: otherUID, Gid: proxyGID}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client as uid %d: %v\n%s", otherUID, err, out)
	}
	if got := strings.TrimSpace(string(out)); got != codes.PermissionDenied.String() {
		t.Fatalf("a stream from uid %d: %q, want %s", otherUID, got, codes.PermissionDenied)
	}
	testkit.Contains(t, "logs", p.logs.String(), "refused a stream on the XDS socket", "open_uid=0", "new_uid="+strconv.Itoa(otherUID),
		"open_pid="+strconv.Itoa(os.Getpid()))

	// Envoy's stream was not touched, and still carries pushes.
	snapshot(t, cp, "v2", 4)
	if err := envoy.WaitFor(ctx, bothTypes("v2", 4)); err != nil {
		t.Fatal(err)
	}
	if ends := envoy.State().Ends; len(ends) != 0 {
		t.Errorf("Envoy's stream ended %v", ends)
	}

	// A newer stream of Envoy's uid replaces it, logged with both peers.
	newer := p.clientWith(t, xdsserver.ClientOptions{})
	if err := newer.WaitFor(ctx, bothTypes("v2", 4)); err != nil {
		t.Fatal(err)
	}
	testkit.Contains(t, "logs", p.logs.String(), "a newer Envoy stream replaces the open one", "open_uid=0 new_pid="+strconv.Itoa(os.Getpid())+" new_uid=0")
}
