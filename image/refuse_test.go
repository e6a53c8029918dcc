package image

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// A bad base, a bad platform or a missing binary is refused with an error
// naming the cause, before anything is pushed.
func TestRefusesBadBasesAndPushesNothing(t *testing.T) {
	reg := serve(t)
	noEnvoy := baseFiles("amd64")
	delete(noEnvoy, EnvoyPath)
	noTemplate := baseFiles("amd64")
	delete(noTemplate, TemplatePath)
	push(t, reg+"/bases/no-envoy:1", proxyv2(t, "amd64", noEnvoy))
	push(t, reg+"/bases/no-template:1", proxyv2(t, "amd64", noTemplate))
	// A later layer deletes Envoy (a whiteout), as a bad Dockerfile's RUN rm.
	push(t, reg+"/bases/envoy-deleted:1", proxyv2(t, "amd64", baseFiles("amd64"), tarLayer(t, map[string]string{"/usr/local/bin/.wh.envoy": ""})))
	push(t, reg+"/bases/amd64-only:1", proxyv2(t, "amd64", baseFiles("amd64")))
	push(t, reg+"/bases/multi:1", index(t))
	// A Helm chart stored in the registry: a manifest, but no image.
	push(t, reg+"/bases/chart:1", mutate.ConfigMediaType(proxyv2(t, "amd64", baseFiles("amd64")), "application/vnd.cncf.helm.config.v1+json"))
	amd64Only := map[string]Binaries{"linux/amd64": agents["linux/amd64"]}
	wrongArch := map[string]Binaries{"linux/amd64": agents["linux/amd64"], "linux/arm64": agents["linux/amd64"]}
	noInit := map[string]Binaries{"linux/amd64": {Agent: agents["linux/amd64"].Agent, Init: "/nonexistent/meshagent-init"}}

	for _, tc := range []struct {
		name     string
		o        Options
		err      error
		mentions []string
	}{
		{"no-envoy", Options{Base: reg + "/bases/no-envoy:1"}, ErrNotProxyv2, []string{"no /usr/local/bin/envoy (Envoy)", "linux/amd64"}},
		{"no-template", Options{Base: reg + "/bases/no-template:1"}, ErrNotProxyv2, []string{"no " + TemplatePath + " (Istio's bootstrap template)"}},
		{"envoy-deleted", Options{Base: reg + "/bases/envoy-deleted:1"}, ErrNotProxyv2, []string{"no /usr/local/bin/envoy"}},
		{"wrong-platform", Options{Base: reg + "/bases/amd64-only:1", Platforms: []string{"linux/arm64"}}, ErrPlatform, []string{"has no linux/arm64 (it has linux/amd64)"}},
		{"platform-not-in-index", Options{Base: reg + "/bases/multi:1", Platforms: []string{"linux/s390x"}}, ErrPlatform, []string{"has no linux/s390x (it has linux/amd64, linux/arm64)"}},
		{"not-an-image", Options{Base: reg + "/bases/chart:1"}, ErrNotImage, []string{"application/vnd.cncf.helm.config.v1+json"}},
		{"no-such-tag", Options{Base: reg + "/bases/no-envoy:2"}, ErrBase, []string{reg + "/bases/no-envoy:2", "MANIFEST_UNKNOWN"}},
		{"unreachable", Options{Base: "127.0.0.1:1/istio/proxyv2:1.28.1"}, ErrBase, []string{"127.0.0.1:1/istio/proxyv2:1.28.1", "connection refused"}},
		{"not-a-tarball", Options{Base: "tarball:image_test.go"}, ErrBase, []string{"image_test.go: not a docker-archive tarball"}},
		{"no-agent-for-arm64", Options{Base: reg + "/bases/multi:1", Agents: amd64Only}, ErrNoAgent, []string{"linux/arm64: give --agent linux/arm64=PATH", "given for linux/amd64"}},
		{"agent-of-another-arch", Options{Base: reg + "/bases/multi:1", Agents: wrongArch}, ErrNoAgent, []string{"built for EM_X86_64, not linux/arm64"}},
		{"no-init", Options{Base: reg + "/bases/amd64-only:1", Agents: noInit}, ErrNoAgent, []string{"/nonexistent/meshagent-init"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Push = reg + "/out/" + tc.name + ":1"
			_, progress, err := build(t, tc.o)
			if !errors.Is(err, tc.err) {
				t.Fatalf("error %v, want %v\nprogress:\n%s", err, tc.err, progress)
			}
			for _, m := range tc.mentions {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not say %q", err, m)
				}
			}
		})
	}
	repos, err := remote.Catalog(context.Background(), must(name.ParseReference(reg+"/out/x")).Context().Registry)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range repos {
		if strings.HasPrefix(r, "out/") {
			t.Errorf("%s was pushed", r)
		}
	}
}
