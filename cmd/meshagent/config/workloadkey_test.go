package config

import (
	"testing"

	"github.com/meshagent/meshagent/services/certs"
)

// The workload key's settings read at the process's start (#36): for proxy
// only, not with file-mounted certificates, and a bad value is left for
// Build to report (the Reader reports a value's error to its first reader).
func TestWorkloadKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want certs.KeySettings
		ok   bool
	}{
		{"defaults", nil, []string{"proxy", "sidecar"}, certs.KeySettings{Algorithm: certs.RSA, RSABits: 2048, Curve: "P256"}, true},
		{"ECDSA", map[string]string{"ECC_SIGNATURE_ALGORITHM": "ECDSA", "ECC_CURVE": "P384"}, []string{"proxy"},
			certs.KeySettings{Algorithm: certs.ECDSA, RSABits: 2048, Curve: "P384"}, true},
		{"not proxy", nil, []string{"version"}, certs.KeySettings{}, false},
		{"no command", nil, nil, certs.KeySettings{}, false},
		{"file-mounted certificates", map[string]string{"FILE_MOUNTED_CERTS": "true"}, []string{"proxy"}, certs.KeySettings{Algorithm: certs.RSA, RSABits: 2048, Curve: "P256"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := WorkloadKey(MapEnvironment(tc.env), tc.args)
			if ok != tc.ok || ok && got != tc.want {
				t.Errorf("WorkloadKey = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestWorkloadKeyLeavesABadValueToBuild(t *testing.T) {
	r := MapEnvironment(map[string]string{"ECC_SIGNATURE_ALGORITHM": "ecdsa"})
	if _, ok := WorkloadKey(r, []string{"proxy"}); ok {
		t.Fatal("a key was started with ECC_SIGNATURE_ALGORITHM=ecdsa")
	}
	var problems Problems
	if v := get(envReader{env: r, problems: &problems}, envECCSignatureAlgorithm); v != "RSA" || problems.Err() == nil {
		t.Errorf("Build's read after WorkloadKey: %q, problems %v; want the default and the bad value reported", v, problems.Err())
	}
}
