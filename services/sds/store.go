package sds

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/filewatch"
)

// store is the one goroutine that owns every secret this server serves: the
// workload certificate and roots (from the certs service, plus the extra
// trust anchors and the CA's CRL), and the file secrets streams ask for. It
// reads its inputs, watches the files, and publishes each change as a new
// view; streams read views and tell the store, over updates, which file
// secrets they want. Nothing else writes a secret.
type store struct {
	cfg     Config
	log     *slog.Logger
	health  *messages.Reporter
	clock   messages.Clock
	certs   messages.Latest[messages.CertBundle]
	anchors messages.Latest[messages.TrustAnchors] // nil: no such input
	// external, when set, is why this server does not serve the workload
	// identity ("default", "ROOTCA"): another SDS server does.
	external string

	updates chan subscription
	views   *messages.Cell[view]
	done    chan struct{} // closed when run returns

	// Owned by run.
	secrets map[string]secretState // the view being built
	files   map[string]*fileSecret // subscribed file secrets, by name
	bundle  messages.CertBundle
	haveB   bool
	extra   [][]byte // extra trust anchors (PEM), checked
	crl     crlState
}

// subscription is a stream's change of the file secrets it wants: the store
// reads them when the first stream wants them and forgets them when the
// last one lets go.
type subscription struct {
	acquire []resource
	release []string
	// applied, if not nil, is closed once the view holds the change: the
	// stream answers from that view, so that a new file secret is in the
	// same response as the secrets asked for with it.
	applied chan struct{}
}

// fileSecret is a subscribed file secret.
type fileSecret struct {
	res   resource
	refs  int
	state secretState
	dirs  []string // watched for it
}

func newStore(s *Service, external string) *store {
	return &store{
		cfg: s.cfg, log: s.log, health: s.health, clock: s.clock, certs: s.in.Certs, anchors: s.in.TrustAnchors, external: external,
		updates: make(chan subscription),
		views:   messages.NewCell[view](),
		done:    make(chan struct{}),
		secrets: map[string]secretState{},
		files:   map[string]*fileSecret{},
	}
}

// run owns the store until ctx is done. It fails only if the file watcher
// cannot be made or breaks.
func (st *store) run(ctx context.Context) error {
	defer close(st.done)
	// The files' directories are added and dropped as secrets come and
	// go (readFile, apply); a directory not there yet is waited for.
	watch, err := filewatch.Start(filewatch.Options{Clock: st.clock, Log: st.log, Debounce: st.cfg.FileDebounce})
	if err != nil {
		return err
	}
	defer watch.Close()

	if st.cfg.CRLFile != "" {
		st.readCRL(watch)
	}
	bundle, haveB, certsChanged := st.certs.Watch()
	st.bundle, st.haveB = bundle, haveB
	var anchorsChanged <-chan struct{}
	if st.anchors != nil {
		var a messages.TrustAnchors
		var ok bool
		a, ok, anchorsChanged = st.anchors.Watch()
		st.setAnchors(a, ok)
	}
	st.computeIdentity()
	st.publish()

	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-certsChanged:
			st.bundle, st.haveB, certsChanged = st.certs.Watch()
			st.computeIdentity()
		case <-anchorsChanged:
			var a messages.TrustAnchors
			var ok bool
			a, ok, anchorsChanged = st.anchors.Watch()
			st.setAnchors(a, ok)
			st.computeIdentity()
		case sub := <-st.updates:
			st.apply(sub, watch)
			st.publish()
			if sub.applied != nil {
				close(sub.applied)
			}
			continue
		case dirs := <-watch.Changes():
			st.reload(dirs, watch)
		case err := <-watch.Failed():
			return err
		}
		st.publish()
	}
}

// update hands a stream's subscription change to the store and waits until
// the published view holds it. It fails only when the store or the stream
// has ended.
func (st *store) update(ctx context.Context, sub subscription) error {
	sub.applied = make(chan struct{})
	select {
	case st.updates <- sub:
	case <-st.done:
		return errShuttingDown
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-sub.applied:
		return nil
	case <-st.done:
		return errShuttingDown
	}
}

// apply takes a stream's subscription change: a file secret wanted for the
// first time is read and watched at once; one nobody wants any more is
// forgotten, and its directories unwatched.
func (st *store) apply(sub subscription, watch *filewatch.Watcher) {
	for _, r := range sub.acquire {
		if !r.fromFiles() {
			continue
		}
		if f, ok := st.files[r.name]; ok {
			f.refs++
			continue
		}
		f := &fileSecret{res: r, refs: 1}
		st.files[r.name] = f
		st.readFile(f, watch)
	}
	for _, name := range sub.release {
		f, ok := st.files[name]
		if !ok {
			continue
		}
		if f.refs--; f.refs > 0 {
			continue
		}
		watch.Remove(f.dirs...)
		delete(st.files, name)
		delete(st.secrets, name)
	}
}

// reload re-reads the file secrets and the CRL in the changed directories.
func (st *store) reload(changed []string, watch *filewatch.Watcher) {
	touches := func(dirs []string) bool {
		return slices.ContainsFunc(dirs, func(d string) bool { return slices.Contains(changed, d) })
	}
	for _, f := range st.files {
		if touches(f.dirs) {
			st.readFile(f, watch)
		}
	}
	if st.cfg.CRLFile != "" && touches(st.crl.dirs) {
		st.readCRL(watch)
		st.computeIdentity()
	}
}

// readCRL (re)reads the CRL file and moves its watches like readFile.
func (st *store) readCRL(watch *filewatch.Watcher) {
	prev := st.crl
	dirs := dirsOf(st.cfg.CRLFile)
	watch.Add(dirs...) // before the read, as readFile does
	watch.Remove(prev.dirs...)
	st.crl = readCRL(st.cfg.CRLFile, prev)
	st.crl.dirs = dirs
	switch {
	case st.crl.err != nil && (prev.err == nil || prev.err.Error() != st.crl.err.Error()):
		st.log.Warn("cannot use the CA's CRL file", "file", st.cfg.CRLFile, "error", st.crl.err)
	case st.crl.err == nil && !bytes.Equal(st.crl.pem, prev.pem):
		st.log.Info("CA's CRL changed", "file", st.cfg.CRLFile, "present", st.crl.pem != nil)
	}
}

// readFile (re)reads a file secret and keeps its last good secret on
// failure. Its directories are watched before the read, so that a change
// right after it is seen, and follow where its files now are (a symlink's
// target may have moved).
func (st *store) readFile(f *fileSecret, watch *filewatch.Watcher) {
	dirs := dirsOf(filesOf(f.res, st.cfg.SystemRootFiles)...)
	watch.Add(dirs...)
	watch.Remove(f.dirs...)
	f.dirs = dirs
	secret, version, err := readFileSecret(f.res, st.cfg.SystemRootFiles)
	if err != nil {
		if f.state.err == nil || f.state.err.Error() != err.Error() {
			st.log.Warn("cannot serve secret from file", "name", f.res.name, "error", err)
		}
		f.state.err = err
	} else {
		if version != f.state.version {
			st.log.Info("read secret from file", "name", f.res.name, "version", version)
		}
		f.state = secretState{secret: secret, version: version}
	}
	st.secrets[f.res.name] = f.state
}

// setAnchors keeps the extra trust anchors that parse, and says which do not.
func (st *store) setAnchors(a messages.TrustAnchors, ok bool) {
	if !ok {
		st.extra = nil
		return
	}
	var errs []error
	st.extra, errs = checkAnchors(a.PEM)
	for _, err := range errs {
		st.log.Warn("ignoring an extra trust anchor from the ProxyConfig (caCertificatesPem)", "version", a.Version, "error", err)
	}
}

// computeIdentity rebuilds "default" and "ROOTCA" from the bundle, the extra
// trust anchors and the CRL. Before the first bundle neither exists, so
// streams asking for them wait, as Istio's do while it warms the
// certificate.
func (st *store) computeIdentity() {
	if st.external != "" {
		err := status.Errorf(codes.FailedPrecondition, "%s: this server serves file secrets only", st.external)
		st.secrets[WorkloadKeyCertResourceName] = secretState{err: err}
		st.secrets[RootCertResourceName] = secretState{err: err}
		return
	}
	if !st.haveB {
		return
	}
	// Each secret's version is its own content's: a bundle whose roots
	// changed (a root file in Istio's mixed mode, a CA root rotation) does
	// not push "default" again, nor a renewal "ROOTCA".
	version := "cert-" + messages.ContentVersion(st.bundle.CertChainPEM, st.bundle.KeyPEM)
	if cur := st.secrets[WorkloadKeyCertResourceName]; cur.version != version {
		st.secrets[WorkloadKeyCertResourceName] = st.build(WorkloadKeyCertResourceName, version, func() (secretState, error) {
			a, err := tlsCertificateSecret(WorkloadKeyCertResourceName, st.bundle.CertChainPEM, st.bundle.KeyPEM)
			return secretState{secret: a, version: version}, err
		})
	}
	st.secrets[RootCertResourceName] = st.rootsState()
}

// rootsState is ROOTCA: the mesh roots merged with the extra anchors, and
// the CRL. A CRL file that cannot be used keeps the last good CRL; if there
// was none, the last ROOTCA stays as it was: serving the roots without a CRL
// the CA published would trust what it revoked.
func (st *store) rootsState() secretState {
	prev := st.secrets[RootCertResourceName]
	if st.crl.err != nil && st.crl.pem == nil {
		return secretState{secret: prev.secret, version: prev.version, err: st.crl.err}
	}
	roots := mergeRoots(st.bundle.RootsPEM, st.extra)
	version := "roots-" + messages.ContentVersion(roots, st.crl.pem)
	if prev.version == version && prev.secret != nil {
		return secretState{secret: prev.secret, version: version, err: st.crl.err}
	}
	s := st.build(RootCertResourceName, version, func() (secretState, error) {
		a, err := validationSecret(RootCertResourceName, roots, st.crl.pem)
		return secretState{secret: a, version: version}, err
	})
	if s.err == nil {
		s.err = st.crl.err
	}
	return s
}

// build makes a secret, turning the (never expected) marshal failure into
// the resource's error.
func (st *store) build(name, version string, f func() (secretState, error)) secretState {
	s, err := f()
	if err != nil {
		st.log.Error("cannot build secret", "name", name, "version", version, "error", err)
		return secretState{err: status.Errorf(codes.Internal, "secret %q: %v", name, err)}
	}
	return s
}

// publish sends a copy of the secrets as the new view and reports health:
// Degraded, naming each secret that cannot be served, while any cannot.
func (st *store) publish() {
	st.views.Send(maps.Clone(st.secrets))

	var problems []string
	for _, name := range slices.Sorted(maps.Keys(st.secrets)) {
		err := st.secrets[name].err
		if err == nil || st.external != "" && isIdentity(name) {
			continue // with an external SDS server, "default" and "ROOTCA" are refused by design
		}
		problems = append(problems, status.Convert(err).Message())
	}
	if _, ok := st.secrets[RootCertResourceName]; !ok && st.crl.err != nil {
		problems = append(problems, status.Convert(st.crl.err).Message())
	}
	if len(problems) > 0 {
		st.health.Report(messages.Degraded, "cannot serve: "+strings.Join(problems, "; "))
		return
	}
	st.health.Report(messages.Ready, st.external)
}

func isIdentity(name string) bool {
	return name == WorkloadKeyCertResourceName || name == RootCertResourceName
}
