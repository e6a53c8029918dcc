package config

import (
	"slices"
	"strings"
	"testing"
)

// Each entry is complete and named once: `help env` and the docs are made
// from it.
func TestEnvTableComplete(t *testing.T) {
	seen := map[string]bool{}
	for _, v := range Vars() {
		if seen[v.Name] {
			t.Errorf("%s: twice in the table", v.Name)
		}
		seen[v.Name] = true
		if v.Type == "" || v.Service == "" || v.Doc == "" || v.Default == "" {
			t.Errorf("%s: default %q, type %q, service %q, doc %q: each is required", v.Name, v.Default, v.Type, v.Service, v.Doc)
		}
		if v.Prefix != strings.HasSuffix(v.Name, "_") {
			t.Errorf("%s: a prefix entry, and only one, ends with _", v.Name)
		}
	}
}

func TestFind(t *testing.T) {
	for name, want := range map[string]string{
		"PROV_CERT":              "PROV_CERT",
		"ISTIO_META_DNS_CAPTURE": "ISTIO_META_DNS_CAPTURE", // its own entry, not the prefix's
		"ISTIO_META_FOO":         "ISTIO_META_",
		"ISTIO_METAJSON_LABELS":  "ISTIO_METAJSON_",
	} {
		if v, ok := find(name); !ok || v.Name != want {
			t.Errorf("find(%s) = %s, %v; want %s", name, v.Name, ok, want)
		}
	}
	if v, ok := find("NOT_A_VARIABLE"); ok {
		t.Errorf("find(NOT_A_VARIABLE) = %s", v.Name)
	}
}

// Help prints a default as a user writes it.
func TestDefaultText(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{envSecretTTL.row().Default, "24h"},
		{envMeshagentCertLifetime.row().Default, "1m"},
		{envFileDebounceDuration.row().Default, "100ms"},
		{envEnvoySecureMetricsPort.row().Default, "0 (off)"},
		{envSecretGracePeriodRatioJitter.row().Default, "0.01"},
		{envIstioBootstrap.row().Default, "-"},
		{envProxyGID.row().Default, "PROXY_UID"},
	} {
		if tc.got != tc.want {
			t.Errorf("default %q, want %q", tc.got, tc.want)
		}
	}
}

// find is the table's row for a name: its own entry, else the prefix
// entry it falls under.
func find(name string) (Var, bool) {
	vars := Vars()
	if i := slices.IndexFunc(vars, func(v Var) bool { return !v.Prefix && v.Name == name }); i >= 0 {
		return vars[i], true
	}
	for _, v := range vars {
		if v.Prefix && strings.HasPrefix(name, v.Name) {
			return v, true
		}
	}
	return Var{}, false
}
