package sds

import (
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Istio's encodings of file secrets in resource names
// (security.SdsCertificateConfig): relative paths are the agent's working
// directory's, as Istio's filepath.Abs makes them.
func TestParseResourceName(t *testing.T) {
	wd, _ := os.Getwd()
	for name, want := range map[string]resource{
		"default":                           {name: "default", kind: kindWorkload},
		"ROOTCA":                            {name: "ROOTCA", kind: kindRoots},
		"file-root:system":                  {name: "file-root:system", kind: kindSystemRoots},
		"file-root:/etc/certs/ca.pem":       {name: "file-root:/etc/certs/ca.pem", kind: kindFileRoots, rootPath: "/etc/certs/ca.pem"},
		"file-root:./etc/certs/ca.pem":      {name: "file-root:./etc/certs/ca.pem", kind: kindFileRoots, rootPath: filepath.Join(wd, "etc/certs/ca.pem")},
		"file-cert:/etc/c.pem~/etc/k.pem":   {name: "file-cert:/etc/c.pem~/etc/k.pem", kind: kindFileCert, certPath: "/etc/c.pem", keyPath: "/etc/k.pem"},
		"file-cert:c.pem~/etc/../etc/k.pem": {name: "file-cert:c.pem~/etc/../etc/k.pem", kind: kindFileCert, certPath: filepath.Join(wd, "c.pem"), keyPath: "/etc/k.pem"},
	} {
		got, err := parseResourceName(name)
		if err != nil || got != want {
			t.Errorf("%q: %+v, %v; want %+v", name, got, err, want)
		}
	}
	for _, bad := range []string{"", "rootca", "Default", "file-root:", "file-root:a~b", "file-cert:", "file-cert:a", "file-cert:a~", "file-cert:~b", "file-cert:a~b~c", "spiffe://x"} {
		if _, err := parseResourceName(bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%q: %v; want InvalidArgument", bad, err)
		}
	}
}
