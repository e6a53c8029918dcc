package sds

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/boundedfile"
	"github.com/meshagent/meshagent/services/internal/unique"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// filesOf is the files to watch for a file secret: the ones it names, or for
// the OS trust store the one in use (all candidates while none exists).
func filesOf(r resource, systemRoots []string) []string {
	switch r.kind {
	case kindFileCert:
		return []string{r.certPath, r.keyPath}
	case kindFileRoots:
		return []string{r.rootPath}
	case kindSystemRoots:
		if p := firstExisting(systemRoots); p != "" {
			return []string{p}
		}
		return systemRoots
	}
	return nil
}

func firstExisting(paths []string) string {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// readFileSecret reads the files a file secret names and builds it, checked
// as Istio's secret cache checks it (secretcache.go generateFileSecret):
//
//   - file-cert:<cert>~<key>: the chain and key must make a key pair
//     (tls.LoadX509KeyPair); an expired certificate is served as it is;
//   - file-root:<path>: the certificates that parse are served and the
//     others dropped; none at all is an error (pkiutil.ParseRootCerts);
//   - file-root:system: the same, from the first OS trust store in
//     systemRoots that exists (security.GetOSRootFilePath).
//
// The error is a gRPC status naming the secret and the file: NotFound for a
// missing file, FailedPrecondition for one that cannot be used.
func readFileSecret(r resource, systemRoots []string) (secret *anypb.Any, version string, err error) {
	switch r.kind {
	case kindFileCert:
		chain, err := readFile(r.name, r.certPath)
		if err != nil {
			return nil, "", err
		}
		key, err := readFile(r.name, r.keyPath)
		if err != nil {
			return nil, "", err
		}
		if _, err := tls.X509KeyPair(chain, key); err != nil {
			// crypto/tls's errors describe the PEM structure, never the key.
			return nil, "", status.Errorf(codes.FailedPrecondition, "secret %q: certificate %s and key %s are not a key pair: %v",
				r.name, r.certPath, r.keyPath, err)
		}
		secret, err = tlsCertificateSecret(r.name, chain, key)
		return secret, messages.ContentVersion(chain, key), err
	case kindFileRoots:
		return readRootsSecret(r.name, r.rootPath)
	case kindSystemRoots:
		if p := firstExisting(systemRoots); p != "" {
			return readRootsSecret(r.name, p)
		}
		return nil, "", status.Errorf(codes.NotFound, "secret %q: no OS trust store: none of %s exists",
			r.name, strings.Join(systemRoots, ", "))
	}
	return nil, "", status.Errorf(codes.Internal, "secret %q is not read from files", r.name)
}

func readRootsSecret(name, path string) (*anypb.Any, string, error) {
	data, err := readFile(name, path)
	if err != nil {
		return nil, "", err
	}
	roots, errs := parseRootCerts(data)
	if len(roots) == 0 {
		return nil, "", status.Errorf(codes.FailedPrecondition, "secret %q: no usable CA certificate in %s: %v", name, path, errors.Join(errs...))
	}
	secret, err := validationSecret(name, roots, nil)
	return secret, messages.ContentVersion(roots), err
}

// maxCRLFile bounds the CA's CRL file. A CRL grows with its revocations,
// about 40 bytes each: 16 MiB is some 400,000 revoked certificates, far
// past a mesh CA's, and still a bounded cost.
const maxCRLFile = 16 << 20

// readFile reads one file of a file secret through boundedfile: only a
// regular file, at most boundedfile.MaxPEM: an SDS client can name any
// path, /dev/zero included, and a read without a bound killed the agent
// (issue #21). The error names the secret and the
// file: NotFound for a missing file, FailedPrecondition for anything else
// (a device, a FIFO, a directory, a file too large).
func readFile(name, path string) ([]byte, error) {
	data, err := boundedfile.Read(path, boundedfile.MaxPEM)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, status.Errorf(codes.NotFound, "secret %q: %v", name, err)
	case err != nil:
		return nil, status.Errorf(codes.FailedPrecondition, "secret %q: %v", name, err)
	}
	return data, nil
}

// parseRootCerts keeps the CERTIFICATE blocks of data that parse, re-encoded,
// and says why each other block was dropped. Like Istio's
// pkiutil.ParseRootCerts it tolerates a bad certificate among good ones (RFC
// 5280 asks for graceful handling of, say, a negative serial number) and
// stops at text that is not PEM.
func parseRootCerts(data []byte) ([]byte, []error) {
	var out []byte
	var errs []error
	rest := data
	for n := 1; ; n++ {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			if len(out) == 0 && len(errs) == 0 {
				errs = append(errs, errors.New("no PEM certificate found"))
			}
			return out, errs
		}
		if block.Type != "CERTIFICATE" {
			errs = append(errs, fmt.Errorf("block #%d is a %s, not a CERTIFICATE", n, block.Type))
			continue
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			errs = append(errs, fmt.Errorf("certificate #%d does not parse: %w", n, err))
			continue
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: block.Bytes})...)
	}
}

// crlState is the CA's CRL file (Istio's CACRLFilePath) as last read.
type crlState struct {
	// pem is the CRL served in ROOTCA: the file's content when it was last
	// good, nil when the file does not exist.
	pem []byte
	// err: the file exists but cannot be used (pem keeps the last good).
	err  error
	dirs []string // watched for it
}

// readCRL reads the CRL file: absent is no CRL (Istio's isCrlFileProvided);
// empty is no CRL too, as for Envoy, which Istio's agent hands the file by
// name and which loads a CRL only from a non-empty one (#24: a pod whose
// CRL file was mounted empty never turned ready, ROOTCA refused); present
// with content, every block must be a CRL that parses, or the last good
// one is kept with the error.
func readCRL(path string, prev crlState) crlState {
	data, err := boundedfile.Read(path, maxCRLFile)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && len(bytes.TrimSpace(data)) == 0) {
		return crlState{}
	}
	fail := func(err error) crlState {
		return crlState{pem: prev.pem, err: status.Errorf(codes.FailedPrecondition, "secret %q: CA CRL file %s: %v", RootCertResourceName, path, err)}
	}
	if err != nil {
		return fail(err)
	}
	rest, n := data, 0
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		n++
		if block.Type != "X509 CRL" {
			return fail(fmt.Errorf("block #%d is a %s, not an X509 CRL", n, block.Type))
		}
		if _, err := x509.ParseRevocationList(block.Bytes); err != nil {
			return fail(fmt.Errorf("CRL #%d does not parse: %w", n, err))
		}
	}
	if n == 0 {
		return fail(errors.New("no PEM X509 CRL found"))
	}
	return crlState{pem: data}
}

// dirsOf is the directories to watch for files: each file's own, and its
// symlink target's when that is elsewhere (a Kubernetes "..data" generation,
// an OS trust store linked from another directory). The store moves its
// watches to them at every read, as targets move.
func dirsOf(files ...string) []string {
	var out []string
	for _, f := range files {
		out = append(out, filepath.Dir(f))
		if target, err := filepath.EvalSymlinks(f); err == nil {
			out = append(out, filepath.Dir(target))
		}
	}
	return unique.Values(out)
}
