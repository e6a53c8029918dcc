package config

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Istio's Wasm variables reach the XDS proxy's module cache (#35): by
// default the modules go to Istio's data directory with Istio's expiry,
// purge, timeout and retries; each variable changes its setting, and the
// conversion switched off leaves ECDS as the control plane sent it.
func TestWasmVariables(t *testing.T) {
	root := testRoot(t)
	cfg, err := parseForTest(t, nil, "--root", root)
	if err != nil {
		t.Fatal(err)
	}
	w := cfg.Tree.XDS.Wasm
	if w.Dir != filepath.Join(root, "var/lib/istio/data") || w.ModuleExpiry != 24*time.Hour || w.PurgeInterval != time.Hour ||
		w.HTTPRequestTimeout != 15*time.Second || w.HTTPRequestMaxRetries != 5 || w.MaxModuleBytes != 256<<20 || w.InsecureRegistries != nil {
		t.Errorf("defaults: %+v, want Istio's", w)
	}

	cfg, err = parseForTest(t, map[string]string{
		"WASM_INSECURE_REGISTRIES": "localhost:5000,docker-registry:5000", "WASM_MODULE_EXPIRY": "2h",
		"WASM_PURGE_INTERVAL": "10m", "WASM_HTTP_REQUEST_TIMEOUT": "3s", "WASM_HTTP_REQUEST_MAX_RETRIES": "2",
		"ISTIO_WASM_MAX_BINARY_SIZE_BYTES": "1048576",
	}, "--root", testRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	w = cfg.Tree.XDS.Wasm
	if !slices.Equal(w.InsecureRegistries, []string{"localhost:5000", "docker-registry:5000"}) || w.ModuleExpiry != 2*time.Hour ||
		w.PurgeInterval != 10*time.Minute || w.HTTPRequestTimeout != 3*time.Second || w.HTTPRequestMaxRetries != 2 || w.MaxModuleBytes != 1<<20 {
		t.Errorf("set: %+v", w)
	}

	cfg, err = parseForTest(t, map[string]string{"ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION": "false"}, "--root", testRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tree.XDS.Wasm.Enabled() {
		t.Errorf("conversion off: %+v, want no module directory", cfg.Tree.XDS.Wasm)
	}

	for name, bad := range map[string]string{"WASM_MODULE_EXPIRY": "a day", "WASM_HTTP_REQUEST_MAX_RETRIES": "-1",
		"ISTIO_WASM_MAX_BINARY_SIZE_BYTES": "big", "ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION": "maybe"} {
		_, err := parseForTest(t, map[string]string{name: bad}, "--root", testRoot(t))
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%q: %v, want an error naming it", name, bad, err)
		}
	}
}
