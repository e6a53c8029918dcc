package sds

import (
	"fmt"
	"path/filepath"
	"time"
)

// Istio's names for the two secrets Envoy asks for.
const (
	WorkloadKeyCertResourceName = "default"
	RootCertResourceName        = "ROOTCA"
)

// DefaultStopTimeout bounds the graceful stop (the service's own default).
const DefaultStopTimeout = 5 * time.Second

// Config is the SDS server's configuration.
type Config struct {
	// SocketPath: the unix socket Envoy connects to, absolute (cmd gives
	// Istio's <root>/var/run/secrets/workload-spiffe-uds/socket).
	SocketPath string
	// SocketUID, SocketGID: when >= 0, the socket is chowned to them (the
	// proxy's UID/GID, 1337, when the agent runs as root and Envoy does
	// not). The socket is never world-accessible: 0600, or 0660 when a GID
	// is given.
	SocketUID int
	SocketGID int
	// StopTimeout bounds the graceful stop at shutdown before open streams
	// are cut.
	StopTimeout time.Duration
}

// NewConfig is the config for a server on socketPath, with the socket's
// owner left alone and the default stop timeout.
func NewConfig(socketPath string) Config {
	return Config{
		SocketPath:  socketPath,
		SocketUID:   -1,
		SocketGID:   -1,
		StopTimeout: DefaultStopTimeout,
	}
}

// Validate names the field and value that are wrong.
func (c Config) Validate() error {
	if c.SocketPath == "" || !filepath.IsAbs(c.SocketPath) {
		return fmt.Errorf("sds config: SocketPath %q must be an absolute path", c.SocketPath)
	}
	// sun_path is 108 bytes on Linux, including the terminating NUL.
	if len(c.SocketPath) > 107 {
		return fmt.Errorf("sds config: SocketPath %q is %d bytes; a unix socket path must be at most 107", c.SocketPath, len(c.SocketPath))
	}
	if c.StopTimeout < 0 {
		return fmt.Errorf("sds config: StopTimeout %v must not be negative", c.StopTimeout)
	}
	return nil
}
