package config

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/meshagent/meshagent/services/envoy"
)

// --hot-restart (MESHAGENT_HOT_RESTART) gives the envoy service its hot
// restart: the files to watch, a base id of its own root, and a Reload that
// sees an edit of the mesh config file (#25). Off, there is none.
func TestHotRestartConfig(t *testing.T) {
	root := testRoot(t)
	meshFile := filepath.Join(root, "etc/istio/config/mesh")
	if err := os.MkdirAll(filepath.Dir(meshFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(meshFile, []byte("defaultConfig:\n  concurrency: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"POD_NAME": "app-1", "POD_NAMESPACE": "default", "INSTANCE_IP": "10.1.2.3"}
	off, err := parseForTest(t, env, "--root", root)
	if err != nil {
		t.Fatal(err)
	}
	off.Release()
	if off.Tree.Envoy.HotRestart != nil {
		t.Fatal("hot restart is on without --hot-restart")
	}
	withVar := map[string]string{"MESHAGENT_HOT_RESTART": "true"}
	for k, v := range env {
		withVar[k] = v
	}
	for _, tc := range []struct {
		env  map[string]string
		args []string
	}{{env, []string{"--root", root, "--hot-restart"}}, {withVar, []string{"--root", root}}} {
		args := tc.args
		if err := os.WriteFile(meshFile, []byte("defaultConfig:\n  concurrency: 2\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		on, err := parseForTest(t, tc.env, args...)
		if err != nil {
			t.Fatal(err)
		}
		hr := on.Tree.Envoy.HotRestart
		if hr == nil {
			t.Fatalf("%v, %v: no hot restart", args, tc.env)
		}
		if !slices.Contains(hr.Watch, meshFile) || !slices.Contains(hr.Watch, filepath.Join(root, "etc/istio/pod/annotations")) {
			t.Errorf("watching %v: want the mesh config file and the pod's annotations", hr.Watch)
		}
		if hr.ParentShutdownDuration != envoy.DefaultParentShutdownDuration || hr.BaseID != HotRestartBaseID(on.Tree.Envoy.Bootstrap.ConfigPath) {
			t.Errorf("parent shutdown %v, base id %d", hr.ParentShutdownDuration, hr.BaseID)
		}
		before, err := hr.Reload()
		if err != nil || before.Args.Concurrency != 2 {
			t.Fatalf("Reload: concurrency %d (%v), want 2", before.Args.Concurrency, err)
		}
		if err := os.WriteFile(meshFile, []byte("defaultConfig:\n  concurrency: 4\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		after, err := hr.Reload()
		if err != nil || after.Args.Concurrency != 4 {
			t.Fatalf("Reload after the mesh config edit: concurrency %d (%v), want 4", after.Args.Concurrency, err)
		}
		if err := os.WriteFile(meshFile, []byte("defaultConfig: [not a map\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := hr.Reload(); err == nil {
			t.Fatal("Reload of a broken mesh config file: no error")
		}
		on.Release()
	}
	other, err := parseForTest(t, withVar, "--root", testRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	if other.Tree.Envoy.HotRestart.BaseID == HotRestartBaseID(off.Tree.Envoy.Bootstrap.ConfigPath) {
		t.Error("two roots, one base id")
	}
}
