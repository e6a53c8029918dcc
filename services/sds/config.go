package sds

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/meshagent/meshagent/services/internal/uds"
)

// stopTimeout is the service's own tuning. Istio's paths (the sockets, the
// CRL file) and FILE_DEBOUNCE_DURATION come from cmd's tables, as
// explicit values (#34).
const stopTimeout = 5 * time.Second

// SystemRootFiles are the OS trust stores Istio looks for, in its order
// (security.GetOSRootFilePath, after crypto/x509's root_linux.go): the first
// that exists is served as "file-root:system". They are the OS's files, not
// Istio's, so they are not under the agent's root.
func SystemRootFiles() []string {
	return []string{
		"/etc/ssl/certs/ca-certificates.crt",                // Debian/Ubuntu/Gentoo etc.
		"/etc/pki/tls/certs/ca-bundle.crt",                  // Fedora/RHEL 6
		"/etc/ssl/ca-bundle.pem",                            // OpenSUSE
		"/etc/pki/tls/cacert.pem",                           // OpenELEC
		"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", // CentOS/RHEL 7
		"/etc/ssl/cert.pem",                                 // Alpine Linux
		"/usr/local/etc/ssl/cert.pem",                       // FreeBSD
		"/etc/ssl/certs/ca-certificates",                    // Talos Linux
	}
}

// Config is the SDS server's configuration. A field tagged env:"NAME"
// takes that variable's value (testkit.FillFromTable).
type Config struct {
	// SocketPath: the unix socket this server serves Envoy on
	// (<root>/var/run/secrets/workload-spiffe-uds/socket).
	SocketPath string
	// WorkloadIdentitySocketFile (WORKLOAD_IDENTITY_SOCKET_FILE, default
	// "socket"): the name, in SocketPath's directory, of the socket
	// Envoy's sds-grpc cluster connects to (see EnvoySocketPath). It must
	// be a file name: a path is a configuration error, as in Istio. When a
	// live SDS server (SPIRE's agent, say) answers on it, this server does
	// not serve the workload identity and serves file secrets only, on
	// FilesSocketPath; when it names another socket than SocketPath's and
	// nothing answers there, Serve fails naming it. Empty is SocketPath's
	// own name.
	WorkloadIdentitySocketFile string `env:"WORKLOAD_IDENTITY_SOCKET_FILE"`
	// FilesSocketPath: where file secrets are served when an external SDS
	// server serves the workload identity
	// (<root>/var/run/secrets/credential-uds/files-socket). Empty: not
	// served at all then.
	FilesSocketPath string
	// SocketOwner: who the socket is chowned to (default uds.Unowned).
	SocketOwner uds.Owner
	// FileDebounce (FILE_DEBOUNCE_DURATION; 0: none): quiet time after
	// the last change of a watched file before file secrets and the CRL
	// are read again.
	FileDebounce time.Duration `env:"FILE_DEBOUNCE_DURATION"`
	// SystemRootFiles: the OS trust stores "file-root:system" is read from,
	// the first that exists (default SystemRootFiles(), Istio's list).
	SystemRootFiles []string
	// CRLFile: a plugged-in CA's CRL, added to ROOTCA while the file exists
	// and pushed again when it changes
	// (<root>/var/run/secrets/istio/crl/ca-crl.pem). Empty turns it off
	// (PILOT_ENABLE_CA_CRL=false; Istio's default is on).
	CRLFile string
	// StopTimeout bounds the graceful stop at shutdown before open streams
	// are cut.
	StopTimeout time.Duration
}

// NewConfig is the config for a server on socketPath, quiet for
// fileDebounce after a file changes (FILE_DEBOUNCE_DURATION), with the
// service's own defaults: the socket's owner left alone, no files-only
// socket and no CRL (cmd sets those paths), Istio's trust-store list.
func NewConfig(socketPath string, fileDebounce time.Duration) Config {
	return Config{
		SocketPath:      socketPath,
		SocketOwner:     uds.Unowned,
		FileDebounce:    fileDebounce,
		SystemRootFiles: SystemRootFiles(),
		StopTimeout:     stopTimeout,
	}
}

// EnvoySocketPath is the socket Envoy's sds-grpc cluster must connect to:
// WorkloadIdentitySocketFile in SocketPath's directory (Istio's
// GetWorkloadSDSSocketListenPath). Istio's bootstrap template names the same
// file (workload_identity_socket_file).
func (c Config) EnvoySocketPath() string {
	if c.WorkloadIdentitySocketFile == "" {
		return c.SocketPath
	}
	return filepath.Join(filepath.Dir(c.SocketPath), c.WorkloadIdentitySocketFile)
}

// Validate names the field and value that are wrong.
func (c Config) Validate() error {
	if err := checkSocketPath("SocketPath", c.SocketPath); err != nil {
		return err
	}
	if f := c.WorkloadIdentitySocketFile; f != "" && (f != filepath.Base(f) || f == "." || f == "..") {
		return fmt.Errorf("sds config: WorkloadIdentitySocketFile (WORKLOAD_IDENTITY_SOCKET_FILE) %q must be a file name, not a path", f)
	}
	if err := checkSocketPath("WorkloadIdentitySocketFile (WORKLOAD_IDENTITY_SOCKET_FILE)", c.EnvoySocketPath()); err != nil {
		return err
	}
	if c.FilesSocketPath != "" {
		if err := checkSocketPath("FilesSocketPath", c.FilesSocketPath); err != nil {
			return err
		}
	}
	if c.FileDebounce < 0 {
		return fmt.Errorf("sds config: FileDebounce (FILE_DEBOUNCE_DURATION) %v must not be negative", c.FileDebounce)
	}
	for _, p := range c.SystemRootFiles {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("sds config: SystemRootFiles entry %q must be an absolute path", p)
		}
	}
	if c.CRLFile != "" && !filepath.IsAbs(c.CRLFile) {
		return fmt.Errorf("sds config: CRLFile %q must be an absolute path", c.CRLFile)
	}
	if c.StopTimeout < 0 {
		return fmt.Errorf("sds config: StopTimeout %v must not be negative", c.StopTimeout)
	}
	return nil
}

func checkSocketPath(field, p string) error {
	if p == "" || !filepath.IsAbs(p) {
		return fmt.Errorf("sds config: %s %q must be an absolute path", field, p)
	}
	// sun_path is 108 bytes on Linux, including the terminating NUL.
	if len(p) > 107 {
		return fmt.Errorf("sds config: %s %q is %d bytes; a unix socket path must be at most 107", field, p, len(p))
	}
	return nil
}
