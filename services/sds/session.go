package sds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
)

// session is what an SDS stream keeps whatever its protocol (SotW or
// Delta): its number and log, its hold on file secrets, and its nonces.
// What each protocol remembers of what it sent is its own.
type session struct {
	h         *handler
	ctx       context.Context
	id        int64
	log       *slog.Logger
	sub       subscriber
	nonces    int
	lastNonce string // of the last response sent
}

// newSession numbers a new stream; attrs go on its log lines after the
// number.
func (h *handler) newSession(ctx context.Context, attrs ...any) *session {
	id := h.svc.streamIDs.Add(1)
	log := h.svc.log.With(append([]any{"stream", id}, attrs...)...)
	return &session{h: h, ctx: ctx, id: id, log: log, sub: subscriber{store: h.store}}
}

// nextNonce numbers a response: the stream's number and a count, so that a
// nonce names one response of one stream.
func (s *session) nextNonce() string {
	s.nonces++
	s.lastNonce = fmt.Sprintf("%d-%d", s.id, s.nonces)
	return s.lastNonce
}

// serveSession is the loop both protocols share. It waits for a request or
// for the secrets to change. handle reads a request into the secrets the
// stream now wants (false: the request changes nothing, as an ACK of an
// older response); the session holds their files before anything is sent.
// After each request or change, push sends what the stream has not been
// told yet of secrets. It returns when the stream ends (nil when Envoy
// closed it), the context ends, the service stops, or handle or push fail.
func serveSession[Req any](s *session, recv func() (Req, error), handle func(Req) ([]resource, bool, error), push func(view) error) error {
	h := s.h
	h.svc.m.streams.Inc()
	defer h.svc.m.streams.Dec()
	s.log.Debug("SDS stream opened")
	defer s.log.Debug("SDS stream closed")
	defer s.sub.close()

	reqs, recvErr := receive(h, s.ctx, recv)
	secrets, _, changed := h.store.views.Watch()
	for {
		select {
		case <-h.stop:
			return errShuttingDown
		case <-s.ctx.Done():
			return s.ctx.Err()
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-changed:
			secrets, _, changed = h.store.views.Watch()
		case req := <-reqs:
			rs, ok, err := handle(req)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			if err := s.sub.want(s.ctx, rs); err != nil {
				return err
			}
			secrets, _, changed = h.store.views.Watch() // holds what want acquired
		}
		if err := push(secrets); err != nil {
			return err
		}
	}
}

// receive runs stream.Recv in its own goroutine so that the stream loop can
// also wait for new secrets. The goroutine ends when the stream does.
func receive[T any](h *handler, ctx context.Context, recv func() (T, error)) (<-chan T, <-chan error) {
	reqs := make(chan T)
	errc := make(chan error, 1)
	h.readers.Add(1)
	go func() {
		defer h.readers.Done()
		for {
			r, err := recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case reqs <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	return reqs, errc
}

// subscriber is one stream's hold on the store's file secrets: the store
// reads and watches a file secret while some stream holds it.
type subscriber struct {
	store *store
	held  map[string]bool
}

// want makes the stream hold exactly the file secrets among rs.
func (s *subscriber) want(ctx context.Context, rs []resource) error {
	var sub subscription
	next := map[string]bool{}
	for _, r := range rs {
		if !r.fromFiles() || next[r.name] {
			continue
		}
		next[r.name] = true
		if !s.held[r.name] {
			sub.acquire = append(sub.acquire, r)
		}
	}
	for n := range s.held {
		if !next[n] {
			sub.release = append(sub.release, n)
		}
	}
	if len(sub.acquire)+len(sub.release) == 0 {
		return nil
	}
	if err := s.store.update(ctx, sub); err != nil {
		return err
	}
	s.held = next
	return nil
}

// close lets go of everything the stream held; the store may be gone
// already (shutdown).
func (s *subscriber) close() {
	if len(s.held) == 0 {
		return
	}
	sub := subscription{release: slices.Collect(maps.Keys(s.held))}
	select {
	case s.store.updates <- sub:
	case <-s.store.done:
	}
	s.held = nil
}
