package kube

// The registry round trip (#32): the suite serves an OCI registry
// (go-containerregistry's pkg/registry) inside the node's network namespace
// on $KN_REGISTRY, where the node's containerd pulls over plain HTTP; the
// sidecar images are pushed there and the kubelet pulls them
// (imagePullPolicy Always, set in the injector's values by up), as in a
// user's cluster. Nothing is imported with ctr.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// Where the suite pushes each agent's image, under $KN_REGISTRY.
const (
	oracleRepo = "istio-proxyv2:oracle"
	oursRepo   = "meshagent-proxyv2:dev"
	baseRepo   = "standin-proxyv2:base" // what `meshagent image` layers ours onto
)

// nodeRegistry is the registry the suite serves to the node, for as long as
// the test runs.
type nodeRegistry struct {
	addr      string // host:port, $KN_REGISTRY
	netns     string // the node's network namespace, where addr listens
	transport http.RoundTripper
}

// serveRegistry listens on $KN_REGISTRY inside the node's netns (the
// listener's socket lives there whichever thread serves it) and serves an
// in-memory registry until the test ends.
func (n *node) serveRegistry(t *testing.T) *nodeRegistry {
	t.Helper()
	var ln net.Listener
	testkit.InNetns(t, n.netns, func() (err error) {
		ln, err = net.Listen("tcp", n.registry)
		return err
	})
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0))), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = testkit.NetnsDialer(n.netns)
	return &nodeRegistry{addr: n.registry, netns: n.netns, transport: tr}
}

// ref is the reference the node pulls repo:tag by.
func (r *nodeRegistry) ref(repoTag string) string { return r.addr + "/" + repoTag }

// pushTarball pushes the one image of a docker-archive tarball (what `make
// image` writes) as repo:tag and returns its reference by digest, the form
// the kubelet reports as the container's imageID.
func (r *nodeRegistry) pushTarball(t *testing.T, path, repoTag string) string {
	t.Helper()
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	ref, err := name.ParseReference(r.ref(repoTag), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	if err := remote.Write(ref, img, remote.WithTransport(r.transport), remote.WithContext(ctx)); err != nil {
		t.Fatalf("pushing %s to %s: %v", path, ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pushed %s as %s (%s) in %v", path, ref, digest, time.Since(start).Round(100*time.Millisecond))
	return ref.Context().Name() + "@" + digest.String()
}

// pushOurs puts meshagent's sidecar image in the registry as a user builds
// it (#32): the proxyv2-shaped base `make image` built (our layout with the
// stand-in Envoy, its pilot-agent a placeholder) is pushed first, then
// `meshagent image` pulls it from the registry, appends the agent and pushes
// the result, from inside the node's netns where the registry listens. It
// returns the reference by the digest the tool printed.
func (r *nodeRegistry) pushOurs(t *testing.T, makeImageTar string) string {
	t.Helper()
	bin := filepath.Dir(makeImageTar)
	base := r.pushTarball(t, filepath.Join(bin, "standin-proxyv2-base.tar"), baseRepo)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+r.netns, filepath.Join(bin, "meshagent"), "image",
		"--base", base, "--push", r.ref(oursRepo))
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("meshagent image --base %s --push %s: %v\n%s", base, r.ref(oursRepo), err, stderr.String())
	}
	digest := strings.Fields(stdout.String())
	if len(digest) == 0 || !strings.HasPrefix(digest[0], "sha256:") {
		t.Fatalf("meshagent image printed no digest first: %q", stdout.String())
	}
	t.Logf("meshagent image layered %s onto %s in %v: %s", r.ref(oursRepo), base, time.Since(start).Round(100*time.Millisecond), digest[0])
	ref := r.ref(oursRepo)
	return ref[:strings.LastIndex(ref, ":")] + "@" + digest[0]
}

// pull has the node's containerd pull ref from the registry (ctr, in the
// node's netns, where the registry listens).
func (n *node) pull(t *testing.T, ref string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := n.inNetns(ctx, "ctr", "--address", filepath.Join(n.root, "containerd", "containerd.sock"), "-n", "k8s.io",
		"images", "pull", "--plain-http", ref).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr images pull %s: %v\n%s", ref, err, out)
	}
}

// pulled checks that the kubelet pulled the pod's sidecar from the registry:
// the image is the registry's, the container runs the digest pushed, and
// the pod's events say the image was pulled (not found on the node).
func (s *suite) pulled(t *testing.T, podName string, a agent) error {
	p := s.n.getPod(t, podName)
	st, ok := p.status("istio-proxy")
	if !ok {
		return errors.New("no istio-proxy status")
	}
	if !strings.HasPrefix(a.image, s.n.registry+"/") {
		return fmt.Errorf("the sidecar image %s is not the node registry's (%s)", a.image, s.n.registry)
	}
	if st.ImageID != a.digest {
		return fmt.Errorf("istio-proxy runs %s, the registry holds %s", st.ImageID, a.digest)
	}
	events := s.n.mustKubectl(t, "", "-n", testNS, "get", "events", "--field-selector", "involvedObject.name="+podName,
		"-o", "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}")
	for _, l := range strings.Split(events, "\n") {
		if strings.HasPrefix(l, "Pulled: Successfully pulled image \""+a.image+"\"") {
			t.Logf("%s", l)
			return nil
		}
	}
	return fmt.Errorf("no event of %s pulled for %s:\n%s", a.image, podName, events)
}

// noSuchImage creates a pod whose sidecar names an image the registry does
// not have: the kubelet must fail it visibly (ErrImagePull, then
// ImagePullBackOff), and the pod never turns Ready.
func (s *suite) noSuchImage(t *testing.T, a agent) error {
	p := podSpec{name: "no-such-image", app: "no-such-image", serviceAccount: "sa-" + a.name,
		proxyImage: s.n.registry + "/meshagent-proxyv2:no-such-tag", native: true}
	if _, err := s.n.kubectl(p.manifest(s.n), "apply", "-f", "-"); err != nil {
		return err
	}
	defer s.deletePod(t, p.name)
	var last string
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		// istio-init runs first and has the same image: it is the one
		// that waits on the pull.
		reason := s.n.mustKubectl(t, "", "-n", testNS, "get", "pod", p.name, "-o",
			`jsonpath={.status.initContainerStatuses[?(@.name=="istio-init")].state.waiting.reason}`)
		last = reason
		if reason == "ErrImagePull" || reason == "ImagePullBackOff" {
			if s.n.getPod(t, p.name).ready() {
				return fmt.Errorf("the pod is Ready with its sidecar image missing")
			}
			msg := s.n.mustKubectl(t, "", "-n", testNS, "get", "pod", p.name, "-o",
				`jsonpath={.status.initContainerStatuses[?(@.name=="istio-init")].state.waiting.message}`)
			t.Logf("%s: %s: %s", p.name, reason, firstLine(msg))
			return nil
		}
	}
	return fmt.Errorf("istio-init of %s never waited with ErrImagePull (last reason %q):\n%s", p.name, last, s.n.describe(p.name))
}
