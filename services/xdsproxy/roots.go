package xdsproxy

import (
	"bytes"
	"context"
)

// New trust roots are handled here, not by restarting the service (#26).
// The tree used to rebuild the proxy's whole group when the roots changed,
// which restarted the DNS proxy beside it and lost queries; a root
// rotation now only ends the open upstream stream. The handler then ends
// Envoy's stream as it does when the control plane ends one in order, so
// Envoy reconnects at once, keeping its configuration, and the new stream
// dials with the new roots (dialOptions reads them afresh for every
// connection). Serve, the socket and the cache are untouched.

// reasonRootsChanged is why the proxy redials, in its log.
const reasonRootsChanged = "trust roots changed"

// watchesRoots reports whether the roots that verify the control plane can
// follow the certificate bundle: the bundle's own roots (RootsCertBundle),
// or a root file that is, in a pod, the same file-mounted root-cert.pem the
// certs service watches (RootsFile). Plaintext and the system's roots do
// not depend on them.
func (s *Service) watchesRoots() bool {
	return s.in.Certs != nil && !s.cfg.Plaintext && s.cfg.Roots != RootsSystem
}

// rootsBaseline is what the roots are when Serve starts: the streams of
// this run dial with them, or with a later bundle the watch sees.
func (s *Service) rootsBaseline() (roots []byte, seen bool) {
	b, ok := s.in.Certs.Get()
	return b.RootsPEM, ok
}

// watchRoots redials the control plane each time the bundle's roots differ
// from the last ones seen; the first bundle to arrive is not a change.
func (s *Service) watchRoots(ctx context.Context, own *owner, last []byte, seen bool) {
	for {
		b, ok, changed := s.in.Certs.Watch()
		if ok {
			if seen && !bytes.Equal(b.RootsPEM, last) {
				s.warm.drop() // made with the old roots
				own.redial(reasonRootsChanged, b.Version)
			}
			last, seen = b.RootsPEM, true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}
