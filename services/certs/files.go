package certs

import (
	"context"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/boundedfile"
)

// serveFiles follows the file-mounted certificate (see watchFiles), and its
// roots: from RootCertFile, or, in Istio's mixed mode (RootsFromCA), from
// the CA, asked again at each renewal point of the certificate it answers
// with, so that a new mesh root reaches ROOTCA.
func (s *Service) serveFiles(ctx context.Context) error {
	paths := []string{s.cfg.CertChainFile, s.cfg.KeyFile}
	if s.cfg.Roots != RootsFromCA {
		paths = append(paths, s.cfg.RootCertFile)
	}
	watch, err := s.watchFiles(paths...)
	if err != nil {
		return err
	}
	defer watch.Close()

	ca := newCAClient(s) // RootsFromCA: asked for the roots when due
	if s.cfg.Roots == RootsFromCA {
		ca.start()
	}
	s.reload()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-watch.Failed():
			return err
		case <-watch.Changes():
			s.reload()
		case <-ca.due:
			wait, ok, err := ca.renew(ctx, s.rootsFailure)
			if err != nil {
				return err
			}
			if ok {
				s.log.Info("trusted roots from CA", "ca", s.cfg.CAAddr, "refresh_in", wait.Round(time.Millisecond))
				s.reload()
			}
		}
	}
}

// reload reads and checks the files and publishes them if they changed. A bad
// set keeps the last good bundle and reports why.
func (s *Service) reload() {
	b, err := s.readFiles()
	if err != nil {
		s.m.fileFailures.Inc()
		if _, ok := s.last(); ok {
			s.log.Warn("rejected certificate update; still serving the last good certificate", "error", err)
			s.report(messages.Degraded, "rejected certificate update (serving the previous one): "+err.Error())
		} else {
			s.log.Warn("no usable certificate yet", "error", err)
			s.report(messages.Starting, "no usable certificate: "+err.Error())
		}
		return
	}
	if !s.publish(b) {
		s.log.Debug("certificate files unchanged", "version", b.Version)
	}
	s.report(messages.Ready, "")
}

func (s *Service) readFiles() (messages.CertBundle, error) {
	chain, err := boundedfile.Read(s.cfg.CertChainFile, boundedfile.MaxPEM)
	if err != nil {
		return messages.CertBundle{}, fmt.Errorf("read certificate chain: %w", err)
	}
	key, err := boundedfile.Read(s.cfg.KeyFile, boundedfile.MaxPEM)
	if err != nil {
		return messages.CertBundle{}, fmt.Errorf("read private key: %w", err)
	}
	src := bundleSources{s.cfg.CertChainFile, s.cfg.KeyFile, s.cfg.RootCertFile}
	var roots []byte
	if s.cfg.Roots == RootsFromCA {
		if s.caIssued.Version == "" {
			return messages.CertBundle{}, fmt.Errorf("trusted roots: not received from the CA at %s yet", s.cfg.CAAddr)
		}
		roots, src.roots = s.caIssued.RootsPEM, "CA "+s.cfg.CAAddr+" response (last element)"
	} else if roots, err = boundedfile.Read(s.cfg.RootCertFile, boundedfile.MaxPEM); err != nil {
		return messages.CertBundle{}, fmt.Errorf("read root certificates: %w", err)
	}
	return buildBundle(chain, key, roots, src, s.clock.Now())
}

// rootsFailure reports a failed request for the CA's roots (RootsFromCA).
func (s *Service) rootsFailure(err error) {
	s.log.Warn("trusted roots request failed", "ca", s.cfg.CAAddr, "error", err)
	if s.caIssued.Version == "" {
		s.report(messages.Starting, "waiting for the trusted roots from the CA: "+err.Error())
		return
	}
	if _, ok := s.last(); ok {
		s.report(messages.Degraded, "cannot refresh the trusted roots from the CA (serving the previous ones): "+err.Error())
	}
}
