package xdsproxy

import (
	"fmt"
	"log/slog"
	"maps"
	"sort"

	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
)

// The last-known-good configuration: what Envoy last acknowledged, per type
// URL. For State of the World that is the raw response Envoy ACKed; for
// Delta, the set of resources (raw, with their versions) that the ACKed
// responses built up, removals applied. It is fed only by streams of the
// configured node (Config.NodeID), kept for the Service's lifetime (across
// restarts of Serve) and persisted by cachefile.go.

// cacheMode is the protocol the cache was recorded with: a cache of one
// protocol is never served on a stream of the other.
type cacheMode uint8

const (
	modeNone cacheMode = iota
	modeSotW
	modeDelta
)

func (m cacheMode) String() string {
	switch m {
	case modeSotW:
		return "sotw"
	case modeDelta:
		return "delta"
	}
	return "none"
}

type sotwEntry struct {
	b       rawxds.Body // the response as the control plane sent it (the frame's pieces)
	version string
}

type deltaRes struct {
	version string
	b       []byte // the discovery.v3.Resource as the control plane sent it
}

// namesEntry is the DNS name table (NDS) the agent last accepted, as the
// control plane sent it (a serialized istio.networking.nds.v1.NameTable).
// It is kept beside Envoy's configuration, whatever the protocol, so that
// an agent restarted during an outage answers DNS too (issue #21: without
// it, DNS, and so readiness, waited for the control plane).
type namesEntry struct {
	b       []byte
	version string
}

type deltaEntry struct {
	res     map[string]deltaRes
	version string // system_version_info of the last applied response
	size    int64
	// incomplete: the set is known to miss what Envoy holds (Envoy came
	// with resources this cache never saw, or a response could not be
	// tracked). It is neither served nor persisted until a stream starts
	// from nothing for this type.
	incomplete bool
}

// lkg is the last-known-good configuration. It has no lock: it is part of
// the proxy's state, which one goroutine owns (owner.go).
type lkg struct {
	log *slog.Logger
	max int64

	mode     cacheMode
	sotw     map[string]sotwEntry
	delta    map[string]*deltaEntry
	names    *namesEntry
	size     int64
	disabled string // why caching stopped for good (too large)
	gen      uint64 // moves with every change; the writer persists when it did
	// wake is signalled after a change, for the writer; made with the
	// cache and never replaced.
	wake chan struct{}
}

func newLKG(max int64, log *slog.Logger) *lkg {
	return &lkg{log: log, max: max, sotw: map[string]sotwEntry{}, delta: map[string]*deltaEntry{}, wake: make(chan struct{}, 1)}
}

// changed records a change and wakes the writer.
func (c *lkg) changed() {
	c.gen++
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// setMode switches the protocol, dropping what the other one recorded.
func (c *lkg) setMode(m cacheMode) {
	if c.mode == m {
		return
	}
	if c.mode != modeNone && c.size > 0 {
		c.log.Info("Envoy's xDS protocol changed: dropping the cached configuration", "was", c.mode, "now", m)
	}
	c.mode, c.size = m, c.namesSize()
	c.sotw, c.delta = map[string]sotwEntry{}, map[string]*deltaEntry{}
}

func (c *lkg) namesSize() int64 {
	if c.names == nil {
		return 0
	}
	return int64(len(c.names.b))
}

// putNames records the name table the agent accepted (b: the serialized
// NameTable).
func (c *lkg) putNames(b []byte, version string) {
	if c.disabled != "" {
		return
	}
	c.size += int64(len(b)) - c.namesSize()
	c.names = &namesEntry{b: b, version: version}
	c.checkSize()
	c.changed()
}

// checkSize disables the cache for good once it outgrows its bound: a
// configuration that large is not cached at all rather than in part.
func (c *lkg) checkSize() {
	if c.size <= c.max {
		return
	}
	c.disabled = fmt.Sprintf("the configuration (%d bytes) exceeds CacheMaxBytes (%d)", c.size, c.max)
	c.log.Warn("not caching the xDS configuration any more", "reason", c.disabled)
	c.sotw, c.delta, c.names, c.size = map[string]sotwEntry{}, map[string]*deltaEntry{}, nil, 0
}

// putSotW records a State of the World response Envoy ACKed.
func (c *lkg) putSotW(typeURL string, b rawxds.Body, version string) {
	if c.disabled != "" {
		return
	}
	c.setMode(modeSotW)
	c.size += int64(b.Len()) - int64(c.sotw[typeURL].b.Len())
	c.sotw[typeURL] = sotwEntry{b: b, version: version}
	c.checkSize()
	c.changed()
}

// startDelta is called before the first ACK of typeURL on a Delta stream,
// with the resources Envoy said it had when the stream began
// (initial_resource_versions): the cache keeps only those, so that it
// holds what Envoy holds, and is incomplete if Envoy had something it
// never saw.
func (c *lkg) startDelta(typeURL string, initial map[string]string) {
	if c.disabled != "" {
		return
	}
	e := c.deltaSet(typeURL)
	e.incomplete = false
	for name := range e.res {
		if _, ok := initial[name]; !ok {
			c.removeRes(e, name)
		}
	}
	for name, v := range initial {
		if r, ok := e.res[name]; !ok || r.version != v {
			e.incomplete = true
			break
		}
	}
	c.changed()
}

// applyDelta records a Delta response Envoy ACKed.
func (c *lkg) applyDelta(typeURL string, f *rawxds.Frame) {
	parts, err := rawxds.SplitDelta(f.Body, f.Resources)
	if c.disabled != "" {
		return
	}
	e := c.deltaSet(typeURL)
	defer c.changed()
	if err != nil {
		c.markIncomplete(typeURL, e, err.Error())
		return
	}
	for _, raw := range parts.Resources {
		info, err := rawxds.ScanResource(raw)
		if err != nil {
			c.markIncomplete(typeURL, e, err.Error())
			return
		}
		if !info.HasBody {
			continue // a TTL heartbeat: nothing changes
		}
		c.removeRes(e, info.Name)
		if info.NoCache {
			// do_not_cache: "xDS proxies may not cache this resource";
			// a TTL'd resource would be served past its life.
			continue
		}
		e.res[info.Name] = deltaRes{version: info.Version, b: raw}
		e.size += int64(len(raw))
		c.size += int64(len(raw))
	}
	for _, name := range parts.Removed {
		c.removeRes(e, name)
	}
	e.version = f.Version
	c.checkSize()
}

// deltaSet returns typeURL's Delta set, created empty if there is none,
// with the cache switched to Delta.
func (c *lkg) deltaSet(typeURL string) *deltaEntry {
	c.setMode(modeDelta)
	e := c.delta[typeURL]
	if e == nil {
		e = &deltaEntry{res: map[string]deltaRes{}}
		c.delta[typeURL] = e
	}
	return e
}

// removeRes drops resource name from e, if there, and its bytes from both
// sizes.
func (c *lkg) removeRes(e *deltaEntry, name string) {
	if old, ok := e.res[name]; ok {
		e.size -= int64(len(old.b))
		c.size -= int64(len(old.b))
		delete(e.res, name)
	}
}

// dropDelta marks a type's Delta set incomplete (a response Envoy ACKed
// could not be tracked).
func (c *lkg) dropDelta(typeURL, why string) {
	if e := c.delta[typeURL]; e != nil && c.mode == modeDelta {
		c.markIncomplete(typeURL, e, why)
		c.changed()
	}
}

func (c *lkg) markIncomplete(typeURL string, e *deltaEntry, why string) {
	if !e.incomplete {
		c.log.Warn("cached Delta configuration is incomplete: it will not be served", "type_url", typeURL, "reason", why)
	}
	e.incomplete = true
}

// servable reports whether the cache holds something to serve on a stream
// of protocol m, and which types.
func (c *lkg) servable(m cacheMode) []string {
	if c.mode != m || c.disabled != "" {
		return nil
	}
	var types []string
	switch m {
	case modeSotW:
		for t := range c.sotw {
			types = append(types, t)
		}
	case modeDelta:
		for t, e := range c.delta {
			if !e.incomplete {
				types = append(types, t)
			}
		}
	}
	sort.Strings(types)
	return types
}

// getSotW returns the cached response of typeURL.
func (c *lkg) getSotW(typeURL string) (sotwEntry, bool) {
	if c.mode != modeSotW || c.disabled != "" {
		return sotwEntry{}, false
	}
	e, ok := c.sotw[typeURL]
	return e, ok
}

// getDelta returns a copy of the cached set of typeURL (the raw resources
// are shared: they are never modified).
func (c *lkg) getDelta(typeURL string) (map[string]deltaRes, string, bool) {
	if c.mode != modeDelta || c.disabled != "" {
		return nil, "", false
	}
	e := c.delta[typeURL]
	if e == nil || e.incomplete {
		return nil, "", false
	}
	return maps.Clone(e.res), e.version, true
}

// cacheSnapshot is the cache's content at one moment, for the writer.
type cacheSnapshot struct {
	mode  cacheMode
	sotw  map[string]sotwEntry
	delta map[string]deltaSnapshot
	names *namesEntry // nil: none
	gen   uint64
	// disabled: nothing may be persisted (and an old file must go).
	disabled bool
}

type deltaSnapshot struct {
	version string
	res     map[string]deltaRes
}

func (c *lkg) snapshot() cacheSnapshot {
	s := cacheSnapshot{mode: c.mode, gen: c.gen, disabled: c.disabled != ""}
	if s.disabled {
		return s
	}
	s.sotw, s.names = maps.Clone(c.sotw), c.names
	s.delta = make(map[string]deltaSnapshot, len(c.delta))
	for t, e := range c.delta {
		if !e.incomplete {
			s.delta[t] = deltaSnapshot{version: e.version, res: maps.Clone(e.res)}
		}
	}
	return s
}

// restore fills an empty cache from a snapshot read from the file.
func (c *lkg) restore(s cacheSnapshot) {
	if c.size > 0 || c.disabled != "" {
		return // what this process recorded is newer
	}
	c.setMode(s.mode)
	if s.names != nil {
		c.names = s.names
		c.size += int64(len(s.names.b))
	}
	for t, e := range s.sotw {
		c.sotw[t] = e
		c.size += int64(e.b.Len())
	}
	for t, d := range s.delta {
		e := &deltaEntry{res: d.res, version: d.version}
		for _, r := range d.res {
			e.size += int64(len(r.b))
		}
		c.delta[t] = e
		c.size += e.size
	}
	c.checkSize()
}
