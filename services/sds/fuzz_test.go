package sds

import (
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FuzzParseResourceName feeds arbitrary SDS resource names, as any client
// on the socket may send them: the parser never panics, refuses what it
// does not serve with InvalidArgument naming the name, and turns a file
// name into absolute, clean paths of its own parts.
func FuzzParseResourceName(f *testing.F) {
	for _, name := range []string{
		WorkloadKeyCertResourceName, RootCertResourceName, FileRootSystemResourceName,
		FileRootPrefix + "/etc/ssl/ca.pem", FileRootPrefix + "relative/ca.pem", FileRootPrefix + "/dev/zero",
		FileCertPrefix + "/etc/c.pem~/etc/k.pem", FileCertPrefix + "~", FileCertPrefix + "a~b~c",
		FileRootPrefix, FileRootPrefix + "../../etc/shadow", "file-root:/a/\x00b", "", "kubernetes://secret",
	} {
		f.Add(name)
	}
	f.Fuzz(func(t *testing.T, name string) {
		r, err := parseResourceName(name)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "unknown secret") {
				t.Fatalf("parseResourceName(%q) = %v, want InvalidArgument", name, err)
			}
			return
		}
		if r.name != name {
			t.Fatalf("parseResourceName(%q) named %q", name, r.name)
		}
		for _, p := range []string{r.certPath, r.keyPath, r.rootPath} {
			if p != "" && (!filepath.IsAbs(p) || filepath.Clean(p) != p) {
				t.Fatalf("parseResourceName(%q): path %q is not absolute and clean", name, p)
			}
		}
		switch r.kind {
		case kindFileCert:
			if r.certPath == "" || r.keyPath == "" || !strings.HasPrefix(name, FileCertPrefix) {
				t.Fatalf("parseResourceName(%q) = %+v", name, r)
			}
		case kindFileRoots:
			if r.rootPath == "" || !strings.HasPrefix(name, FileRootPrefix) || strings.Contains(name, ResourceSeparator) {
				t.Fatalf("parseResourceName(%q) = %+v", name, r)
			}
		}
	})
}
