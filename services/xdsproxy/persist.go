package xdsproxy

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/meshagent/meshagent/services/internal/boundedfile"
	"github.com/meshagent/meshagent/services/xdsproxy/lkg"
)

// cacheWriteDelay coalesces the ACKs of a push (CDS, then EDS, LDS, RDS)
// into one write of the cache file.
const cacheWriteDelay = time.Second

// loadCache reads the cache file once per Service: a restarted Serve keeps
// what it recorded in memory, which is newer.
func (s *Service) loadCache(own *owner) {
	loaded := s.cacheLoaded
	s.cacheLoaded = true
	if loaded || !s.cfg.OfflineCache || s.cfg.CacheFile == "" {
		return
	}
	h, snap, err := lkg.ReadFile(s.cfg.CacheFile, s.cfg.NodeID, s.cfg.DiscoveryAddress, s.cfg.CacheMaxBytes)
	switch {
	case errors.Is(err, lkg.ErrUntrusted), errors.Is(err, boundedfile.ErrNotRegular):
		// Not the agent's file: left where it is, for whoever put it
		// there to explain (the next write replaces it if it can).
		s.log.Warn("ignoring the xDS cache file: not one the agent wrote; starting without the cache", "file", s.cfg.CacheFile, "error", err)
		return
	case err != nil:
		s.log.Warn("ignoring the xDS cache file; it will be replaced", "file", s.cfg.CacheFile, "error", err)
		if err := os.Remove(s.cfg.CacheFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("cannot remove the unusable xDS cache file", "file", s.cfg.CacheFile, "error", err)
		}
		return
	}
	if snap.Mode == lkg.ModeNone && snap.Names == nil {
		return
	}
	types := own.restore(snap)
	s.log.Info("loaded the cached xDS configuration", "file", s.cfg.CacheFile, "written", h.Written.Format(time.RFC3339),
		"protocol", snap.Mode, "types", types, "name_table", snap.Names != nil)
	s.publishCachedNames(snap.Names)
}

// publishCachedNames hands the cached name table to the DNS proxy at
// once, so that DNS (and the agent's readiness) does not wait for a control
// plane that may be down (issue #21). The control plane's table replaces
// it as soon as one arrives.
func (s *Service) publishCachedNames(e *lkg.NamesEntry) {
	if e == nil || !s.cfg.NDS {
		return
	}
	nt, err := decodeNameTable(e.Table, e.Version)
	if err != nil {
		s.log.Warn("not using the cached DNS name table", "file", s.cfg.CacheFile, "version", e.Version, "error", err)
		return
	}
	s.out.Names.Send(nt)
	s.log.Info("published the cached DNS name table", "version", e.Version, "hosts", len(nt.Hosts))
}

// writeCache persists the cache after changes, coalesced, and once more
// when ctx ends (after the streams have).
func (s *Service) writeCache(ctx context.Context, own *owner) {
	written := own.cacheSnapshot().Gen
	for {
		select {
		case <-own.cacheChanged():
			select {
			case <-s.clock.After(cacheWriteDelay):
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
		written = s.persist(own, written)
		if ctx.Err() != nil {
			return
		}
	}
}

// persist writes the cache if it changed since generation last; it
// returns the generation now on disk.
func (s *Service) persist(own *owner, last uint64) uint64 {
	snap := own.cacheSnapshot()
	if snap.Gen == last {
		return last
	}
	if snap.Disabled {
		if err := os.Remove(s.cfg.CacheFile); err == nil {
			s.log.Warn("removed the xDS cache file: the configuration is too large to cache", "file", s.cfg.CacheFile)
		}
		return snap.Gen
	}
	h := lkg.Header{NodeID: s.cfg.NodeID, Address: s.cfg.DiscoveryAddress, Written: s.clock.Now()}
	size := lkg.FileSize(h, snap)
	if size > s.cfg.CacheMaxBytes {
		s.m.cacheWrites.WithLabelValues("too_large").Inc()
		s.log.Warn("not writing the xDS cache file: too large", "bytes", size, "max", s.cfg.CacheMaxBytes)
		return snap.Gen
	}
	if err := lkg.WriteFile(s.cfg.CacheFile, func(w io.Writer) error { return lkg.Write(w, h, snap) }); err != nil {
		s.m.cacheWrites.WithLabelValues("error").Inc()
		s.log.Warn("cannot write the xDS cache file", "file", s.cfg.CacheFile, "error", err)
		return last
	}
	s.m.cacheWrites.WithLabelValues("ok").Inc()
	s.log.Debug("wrote the xDS cache file", "file", s.cfg.CacheFile, "bytes", size)
	return snap.Gen
}
