// Package lkg is the XDS proxy's last-known-good configuration: what Envoy
// last acknowledged, per type URL, kept in memory (Cache) and in a file
// (cachefile.go: Write, ReadFile), so that an Envoy that connects while the
// control plane cannot be reached is configured from it, even after the
// agent restarted (#21, #24).
//
// It owns what is kept, its bound (past the bound nothing is cached) and
// the file's format. It does not own when responses are recorded or served:
// the proxy's stream trackers feed it with what Envoy acknowledged and
// replay it (package protocol's Tracker, package xdsproxy's offline.go),
// and the proxy's state owner is the one goroutine that touches a Cache. It
// was part of package xdsproxy until #34 split the proxy into packages a
// reader can hold.
package lkg

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
// configured node (xdsproxy's Config.NodeID), kept for the XDS proxy's
// lifetime (across restarts of its Serve) and persisted by cachefile.go.

// Mode is the protocol the cache was recorded with: a cache of one
// protocol is never served on a stream of the other.
type Mode uint8

const (
	ModeNone Mode = iota
	ModeSotW
	ModeDelta
)

func (m Mode) String() string {
	switch m {
	case ModeSotW:
		return "sotw"
	case ModeDelta:
		return "delta"
	}
	return "none"
}

type SotWEntry struct {
	Response rawxds.Body // the response as the control plane sent it (the frame's pieces)
	Version  string
}

type DeltaRes struct {
	Version  string
	Resource []byte // the discovery.v3.Resource as the control plane sent it
}

// NamesEntry is the DNS name table (NDS) the agent last accepted, as the
// control plane sent it (a serialized istio.networking.nds.v1.NameTable).
// It is kept beside Envoy's configuration, whatever the protocol, so that
// an agent restarted during an outage answers DNS too (issue #21: without
// it, DNS, and so readiness, waited for the control plane).
type NamesEntry struct {
	Table   []byte
	Version string
}

type deltaEntry struct {
	res     map[string]DeltaRes
	version string // system_version_info of the last applied response
	size    int64
	// incomplete: the set is known to miss what Envoy holds (Envoy came
	// with resources this cache never saw, or a response could not be
	// tracked). It is neither served nor persisted until a stream starts
	// from nothing for this type.
	incomplete bool
}

// Cache is the last-known-good configuration. It has no lock: it is part
// of the XDS proxy's state, which one goroutine owns (xdsproxy's owner.go).
type Cache struct {
	log *slog.Logger
	max int64

	mode     Mode
	sotw     map[string]SotWEntry
	delta    map[string]*deltaEntry
	names    *NamesEntry
	size     int64
	disabled string // why caching stopped for good (too large)
	gen      uint64 // moves with every change; the writer persists when it did
	// wake is signalled after a change, for the writer; made with the
	// cache and never replaced.
	wake chan struct{}
}

func New(max int64, log *slog.Logger) *Cache {
	return &Cache{log: log, max: max, sotw: map[string]SotWEntry{}, delta: map[string]*deltaEntry{}, wake: make(chan struct{}, 1)}
}

// Wake is signalled after a change, for the writer of the file.
func (c *Cache) Wake() <-chan struct{} { return c.wake }

// changed records a change and wakes the writer.
func (c *Cache) changed() {
	c.gen++
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// setMode switches the protocol, dropping what the other one recorded.
func (c *Cache) setMode(m Mode) {
	if c.mode == m {
		return
	}
	if c.mode != ModeNone && c.size > 0 {
		c.log.Info("Envoy's xDS protocol changed: dropping the cached configuration", "was", c.mode, "now", m)
	}
	c.mode, c.size = m, c.namesSize()
	c.sotw, c.delta = map[string]SotWEntry{}, map[string]*deltaEntry{}
}

func (c *Cache) namesSize() int64 {
	if c.names == nil {
		return 0
	}
	return int64(len(c.names.Table))
}

// PutNames records the name table the agent accepted (b: the serialized
// NameTable).
func (c *Cache) PutNames(b []byte, version string) {
	if c.disabled != "" {
		return
	}
	c.size += int64(len(b)) - c.namesSize()
	c.names = &NamesEntry{Table: b, Version: version}
	c.checkSize()
	c.changed()
}

// checkSize disables the cache for good once it outgrows its bound: a
// configuration that large is not cached at all rather than in part.
func (c *Cache) checkSize() {
	if c.size <= c.max {
		return
	}
	c.disabled = fmt.Sprintf("the configuration (%d bytes) exceeds CacheMaxBytes (%d)", c.size, c.max)
	c.log.Warn("not caching the xDS configuration any more", "reason", c.disabled)
	c.sotw, c.delta, c.names, c.size = map[string]SotWEntry{}, map[string]*deltaEntry{}, nil, 0
}

// PutSotW records a State of the World response Envoy ACKed.
func (c *Cache) PutSotW(typeURL string, b rawxds.Body, version string) {
	if c.disabled != "" {
		return
	}
	c.setMode(ModeSotW)
	c.size += int64(b.Len()) - int64(c.sotw[typeURL].Response.Len())
	c.sotw[typeURL] = SotWEntry{Response: b, Version: version}
	c.checkSize()
	c.changed()
}

// StartDelta is called before the first ACK of typeURL on a Delta stream,
// with the resources Envoy said it had when the stream began
// (initial_resource_versions): the cache keeps only those, so that it
// holds what Envoy holds, and is incomplete if Envoy had something it
// never saw.
func (c *Cache) StartDelta(typeURL string, initial map[string]string) {
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
		if r, ok := e.res[name]; !ok || r.Version != v {
			e.incomplete = true
			break
		}
	}
	c.changed()
}

// ApplyDelta records a Delta response Envoy ACKed.
func (c *Cache) ApplyDelta(typeURL string, f *rawxds.Frame) {
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
		e.res[info.Name] = DeltaRes{Version: info.Version, Resource: raw}
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
func (c *Cache) deltaSet(typeURL string) *deltaEntry {
	c.setMode(ModeDelta)
	e := c.delta[typeURL]
	if e == nil {
		e = &deltaEntry{res: map[string]DeltaRes{}}
		c.delta[typeURL] = e
	}
	return e
}

// removeRes drops resource name from e, if there, and its bytes from both
// sizes.
func (c *Cache) removeRes(e *deltaEntry, name string) {
	if old, ok := e.res[name]; ok {
		e.size -= int64(len(old.Resource))
		c.size -= int64(len(old.Resource))
		delete(e.res, name)
	}
}

// DropDelta marks a type's Delta set incomplete (a response Envoy ACKed
// could not be tracked).
func (c *Cache) DropDelta(typeURL, why string) {
	if e := c.delta[typeURL]; e != nil && c.mode == ModeDelta {
		c.markIncomplete(typeURL, e, why)
		c.changed()
	}
}

func (c *Cache) markIncomplete(typeURL string, e *deltaEntry, why string) {
	if !e.incomplete {
		c.log.Warn("cached Delta configuration is incomplete: it will not be served", "type_url", typeURL, "reason", why)
	}
	e.incomplete = true
}

// Servable reports whether the cache holds something to serve on a stream
// of protocol m, and which types.
func (c *Cache) Servable(m Mode) []string {
	if c.mode != m || c.disabled != "" {
		return nil
	}
	var types []string
	switch m {
	case ModeSotW:
		for t := range c.sotw {
			types = append(types, t)
		}
	case ModeDelta:
		for t, e := range c.delta {
			if !e.incomplete {
				types = append(types, t)
			}
		}
	}
	sort.Strings(types)
	return types
}

// SotW returns the cached response of typeURL.
func (c *Cache) SotW(typeURL string) (SotWEntry, bool) {
	if c.mode != ModeSotW || c.disabled != "" {
		return SotWEntry{}, false
	}
	e, ok := c.sotw[typeURL]
	return e, ok
}

// Delta returns a copy of the cached set of typeURL (the raw resources
// are shared: they are never modified).
func (c *Cache) Delta(typeURL string) (map[string]DeltaRes, string, bool) {
	if c.mode != ModeDelta || c.disabled != "" {
		return nil, "", false
	}
	e := c.delta[typeURL]
	if e == nil || e.incomplete {
		return nil, "", false
	}
	return maps.Clone(e.res), e.version, true
}

// Snapshot is the cache's content at one moment, for the writer.
type Snapshot struct {
	Mode  Mode
	SotW  map[string]SotWEntry
	Delta map[string]DeltaSnapshot
	Names *NamesEntry // nil: none
	Gen   uint64
	// disabled: nothing may be persisted (and an old file must go).
	Disabled bool
}

type DeltaSnapshot struct {
	Version   string
	Resources map[string]DeltaRes
}

func (c *Cache) Snapshot() Snapshot {
	s := Snapshot{Mode: c.mode, Gen: c.gen, Disabled: c.disabled != ""}
	if s.Disabled {
		return s
	}
	s.SotW, s.Names = maps.Clone(c.sotw), c.names
	s.Delta = make(map[string]DeltaSnapshot, len(c.delta))
	for t, e := range c.delta {
		if !e.incomplete {
			s.Delta[t] = DeltaSnapshot{Version: e.version, Resources: maps.Clone(e.res)}
		}
	}
	return s
}

// Restore fills an empty cache from a snapshot read from the file.
func (c *Cache) Restore(s Snapshot) {
	if c.size > 0 || c.disabled != "" {
		return // what this process recorded is newer
	}
	c.setMode(s.Mode)
	if s.Names != nil {
		c.names = s.Names
		c.size += int64(len(s.Names.Table))
	}
	for t, e := range s.SotW {
		c.sotw[t] = e
		c.size += int64(e.Response.Len())
	}
	for t, d := range s.Delta {
		e := &deltaEntry{res: d.Resources, version: d.Version}
		for _, r := range d.Resources {
			e.size += int64(len(r.Resource))
		}
		c.delta[t] = e
		c.size += e.size
	}
	c.checkSize()
}
