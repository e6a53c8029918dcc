package sds

import (
	"fmt"
	"path/filepath"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Istio's names for the secrets Envoy asks for (pkg/security/security.go).
const (
	// WorkloadKeyCertResourceName is the workload certificate and key.
	WorkloadKeyCertResourceName = "default"
	// RootCertResourceName is the mesh's trusted roots (with the extra
	// trust anchors and the CA's CRL).
	RootCertResourceName = "ROOTCA"
	// FileRootSystemResourceName is the OS trust store: istiod asks for it
	// for every DestinationRule TLS origination without caCertificates.
	FileRootSystemResourceName = "file-root:system"
	// FileRootPrefix + <path>: trusted roots read from a file.
	FileRootPrefix = "file-root:"
	// FileCertPrefix + <cert>~<key>: a certificate chain and key read from
	// files (DestinationRule clientCertificate/privateKey).
	FileCertPrefix = "file-cert:"
	// ResourceSeparator splits the two paths of a file-cert name.
	ResourceSeparator = "~"
)

// resourceKind is what a resource name asks for.
type resourceKind int

const (
	kindWorkload    resourceKind = iota // "default"
	kindRoots                           // "ROOTCA"
	kindSystemRoots                     // "file-root:system"
	kindFileRoots                       // "file-root:<path>"
	kindFileCert                        // "file-cert:<cert>~<key>"
)

// resource is a parsed resource name.
type resource struct {
	name string
	kind resourceKind
	// Absolute paths: certPath and keyPath for kindFileCert, rootPath for
	// kindFileRoots.
	certPath, keyPath, rootPath string
}

// fromFiles reports whether the secret is read from files named by the
// request (or the OS trust store), as opposed to the workload identity.
func (r resource) fromFiles() bool {
	return r.kind == kindSystemRoots || r.kind == kindFileRoots || r.kind == kindFileCert
}

// parseResourceName follows Istio's SdsCertificateConfigFromResourceName:
// "file-cert:" is two paths split by "~", "file-root:" one path (a "~" in it
// is not a file-root name). Where Istio silently treats a name it cannot
// parse as a request for the workload certificate (secretcache.go serves the
// cached workload certificate under any unknown name), the name is refused
// here with InvalidArgument, naming it and what this server serves.
//
// Relative paths are taken from the agent's working directory, as Istio's
// filepath.Abs does; absolute paths are used as they are (the agent's --root
// prefixes Istio's own well-known paths, not the paths istiod sends).
func parseResourceName(name string) (resource, error) {
	switch name {
	case WorkloadKeyCertResourceName:
		return resource{name: name, kind: kindWorkload}, nil
	case RootCertResourceName:
		return resource{name: name, kind: kindRoots}, nil
	case FileRootSystemResourceName:
		return resource{name: name, kind: kindSystemRoots}, nil
	}
	if rest, ok := strings.CutPrefix(name, FileCertPrefix); ok {
		parts := strings.Split(rest, ResourceSeparator)
		if len(parts) != 2 || parts[0] == "" || parts[1] == "" {
			return resource{}, badName(name, "a file-cert name is file-cert:<certificate chain path>~<private key path>")
		}
		cert, err1 := filepath.Abs(parts[0])
		key, err2 := filepath.Abs(parts[1])
		if err1 != nil || err2 != nil {
			return resource{}, badName(name, fmt.Sprintf("cannot make its paths absolute: %v", firstErr(err1, err2)))
		}
		return resource{name: name, kind: kindFileCert, certPath: cert, keyPath: key}, nil
	}
	if rest, ok := strings.CutPrefix(name, FileRootPrefix); ok {
		if rest == "" || strings.Contains(rest, ResourceSeparator) {
			return resource{}, badName(name, "a file-root name is file-root:<CA certificates path> (one path, no \"~\") or file-root:system")
		}
		root, err := filepath.Abs(rest)
		if err != nil {
			return resource{}, badName(name, fmt.Sprintf("cannot make its path absolute: %v", err))
		}
		return resource{name: name, kind: kindFileRoots, rootPath: root}, nil
	}
	return resource{}, badName(name, fmt.Sprintf("this SDS server serves %q (workload certificate), %q (trusted roots), %q, %s<path> and %s<cert>%s<key>",
		WorkloadKeyCertResourceName, RootCertResourceName, FileRootSystemResourceName, FileRootPrefix, FileCertPrefix, ResourceSeparator))
}

// badName is the InvalidArgument status a malformed or unknown name gets.
func badName(name, why string) error {
	return status.Errorf(codes.InvalidArgument, "unknown secret %q: %s", name, why)
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
