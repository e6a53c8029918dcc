package controlplane

import (
	"fmt"
	"time"

	"github.com/meshagent/meshagent/services/internal/loopback"
)

// The control plane's own tuning: its address is the caller's
// (MESHAGENT_CONTROLPLANE_LISTEN: cmd's env table holds its default, #34).
const (
	debounce    = 100 * time.Millisecond
	stopTimeout = 5 * time.Second
)

// Config is the embedded control plane's configuration.
type Config struct {
	// Listen is the loopback host:port the xDS server listens on. The
	// server has no authorization model beyond an optional token, so it
	// is never exposed beyond the host.
	Listen string
	// MeshFile is the mesh YAML (testdata/standalone/mesh.yaml documents
	// the format), reloaded when it changes.
	MeshFile string
	// TLS, when CertFile is set, serves TLS with that certificate and key;
	// with ClientCAFile it also requires client certificates signed by it.
	// Plaintext otherwise, as istiod's 15010.
	TLS TLSFiles
	// Token, when set, is the bearer token every xDS stream must carry
	// (authorization: Bearer <token>); empty accepts any caller.
	Token string
	// Debounce is how long the mesh file must be quiet before it is read:
	// editors and atomic renames produce bursts of events.
	Debounce time.Duration
	// StopTimeout bounds the graceful stop before open streams are cut.
	StopTimeout time.Duration
}

// TLSFiles are PEM files read when the service starts.
type TLSFiles struct {
	CertFile     string
	KeyFile      string
	ClientCAFile string
}

// NewConfig is a control plane on listen serving meshFile, with its own
// debounce and stop timeout.
func NewConfig(listen, meshFile string) Config {
	return Config{Listen: listen, MeshFile: meshFile, Debounce: debounce, StopTimeout: stopTimeout}
}

// Validate names the field and value that are wrong.
func (c Config) Validate() error {
	if err := loopback.Check(c.Listen); err != nil {
		return fmt.Errorf("--controlplane-listen (MESHAGENT_CONTROLPLANE_LISTEN) %w", err) // #32: name what the user set
	}
	if c.MeshFile == "" {
		return fmt.Errorf("controlplane config: MeshFile is required")
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		return fmt.Errorf("controlplane config: TLS needs both CertFile (%q) and KeyFile (%q)", c.TLS.CertFile, c.TLS.KeyFile)
	}
	if c.TLS.ClientCAFile != "" && c.TLS.CertFile == "" {
		return fmt.Errorf("controlplane config: TLS.ClientCAFile %q needs CertFile and KeyFile", c.TLS.ClientCAFile)
	}
	if c.Debounce <= 0 {
		return fmt.Errorf("controlplane config: Debounce %v must be positive", c.Debounce)
	}
	if c.StopTimeout < 0 {
		return fmt.Errorf("controlplane config: StopTimeout %v must not be negative", c.StopTimeout)
	}
	return nil
}
