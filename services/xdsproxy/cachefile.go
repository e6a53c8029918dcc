package xdsproxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/meshagent/meshagent/services/internal/atomicfile"
	"github.com/meshagent/meshagent/services/internal/boundedfile"
	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
)

// The cache file: the last-known-good configuration, so that an agent that
// restarts during a control plane outage can still configure its Envoy.
//
//	"MESHXDS1" | payload | CRC-32C(magic | payload), big-endian
//
// The payload is protobuf wire format, written and read with protowire:
//
//	1 header { 1 node_id, 2 control plane address, 3 mode, 4 written (unix ns) }
//	2 entry  { 1 type_url, 2 version, 3 SotW response, 4 Delta resource (repeated) }
//	3 names  { 1 version, 2 NameTable }
//
// The mode is none when the file holds only the name table (NDS answered
// before Envoy acknowledged anything).
//
// The checksum catches a truncated or corrupt file, the header a file that
// another node or control plane wrote: either is ignored with a warning and
// removed, never served.

const cacheMagic = "MESHXDS1"

// The checksum is CRC-32C: it is there to catch a truncated or damaged
// file, not an attacker (the file is the agent's own, 0600), and it costs
// a fraction of a cryptographic hash on every write of a large cache.
const checksumSize = crc32.Size

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errCacheFile wraps every reason a cache file is not used.
var errCacheFile = errors.New("cache file not usable")

// errCacheUntrusted: the file could have been written by someone other
// than the agent's user (group- or world-writable, or another owner). It
// is not the agent's file, so it is neither served nor removed (issue
// #21: such a file was loaded and served without a word).
var errCacheUntrusted = errors.New("cache file could have been written by another user")

type cacheHeader struct {
	nodeID  string
	address string
	mode    cacheMode
	written time.Time
}

// encodeCache is the file image of a snapshot (tests; the writer streams
// it with writeCache instead of holding a second copy of the cache).
func encodeCache(h cacheHeader, s cacheSnapshot) []byte {
	var buf bytes.Buffer
	_ = writeCache(&buf, h, s)
	return buf.Bytes()
}

// cacheSize is the size of the file image of s, without building it.
func cacheSize(h cacheHeader, s cacheSnapshot) int64 {
	n := int64(len(cacheMagic) + checksumSize)
	n += fieldSize(len(encodeHeader(h, s.mode)))
	for _, t := range sortedKeys(s.sotw) {
		n += fieldSize(entrySize(t, s.sotw[t].version, s.sotw[t].b, nil))
	}
	for _, t := range sortedKeys(s.delta) {
		n += fieldSize(entrySize(t, s.delta[t].version, nil, s.delta[t].res))
	}
	if s.names != nil {
		n += fieldSize(namesSize(s.names))
	}
	return n
}

func namesSize(e *namesEntry) int {
	return int(fieldSize(len(e.version)) + fieldSize(len(e.b)))
}

// fieldSize is the size of a length-delimited field of n bytes (field
// numbers here are all below 16: a one-byte tag).
func fieldSize(n int) int64 { return int64(1 + protowire.SizeVarint(uint64(n)) + n) }

func entrySize(typeURL, version string, sotw rawxds.Body, delta map[string]deltaRes) int {
	n := int(fieldSize(len(typeURL)) + fieldSize(len(version)))
	if sotw != nil {
		n += int(fieldSize(sotw.Len()))
	}
	for _, r := range delta {
		n += int(fieldSize(len(r.b)))
	}
	return n
}

func encodeHeader(h cacheHeader, mode cacheMode) []byte {
	var hdr []byte
	hdr = protowire.AppendTag(hdr, 1, protowire.BytesType)
	hdr = protowire.AppendString(hdr, h.nodeID)
	hdr = protowire.AppendTag(hdr, 2, protowire.BytesType)
	hdr = protowire.AppendString(hdr, h.address)
	hdr = protowire.AppendTag(hdr, 3, protowire.VarintType)
	hdr = protowire.AppendVarint(hdr, uint64(mode))
	hdr = protowire.AppendTag(hdr, 4, protowire.VarintType)
	return protowire.AppendVarint(hdr, uint64(h.written.UnixNano()))
}

// writeCache streams the file image to w: the resources are written from
// the cache's own slices, the checksum computed on the way.
func writeCache(w io.Writer, h cacheHeader, s cacheSnapshot) error {
	sum := crc32.New(castagnoli)
	out := &cacheWriter{w: io.MultiWriter(w, sum)}
	out.raw([]byte(cacheMagic))
	out.field(1, encodeHeader(h, s.mode))
	entry := func(typeURL, version string, sotw rawxds.Body, delta map[string]deltaRes) {
		out.tag(2, entrySize(typeURL, version, sotw, delta))
		out.field(1, []byte(typeURL))
		out.field(2, []byte(version))
		if sotw != nil {
			// The response's pieces as received: the same bytes as one
			// field, without joining them first.
			out.tag(3, sotw.Len())
			for _, p := range sotw {
				out.raw(p)
			}
		}
		// In map order: the decoder takes each resource's name from it.
		for _, r := range delta {
			out.field(4, r.b)
		}
	}
	for _, t := range sortedKeys(s.sotw) {
		entry(t, s.sotw[t].version, s.sotw[t].b, nil)
	}
	for _, t := range sortedKeys(s.delta) {
		entry(t, s.delta[t].version, nil, s.delta[t].res)
	}
	if s.names != nil {
		out.tag(3, namesSize(s.names))
		out.field(1, []byte(s.names.version))
		out.field(2, s.names.b)
	}
	if out.err != nil {
		return out.err
	}
	_, err := w.Write(sum.Sum(nil))
	return err
}

// cacheWriter writes protobuf fields and keeps the first error.
type cacheWriter struct {
	w   io.Writer
	buf []byte
	err error
}

func (c *cacheWriter) raw(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

// tag writes a length-delimited field's tag and length.
func (c *cacheWriter) tag(num protowire.Number, n int) {
	c.buf = protowire.AppendTag(c.buf[:0], num, protowire.BytesType)
	c.buf = protowire.AppendVarint(c.buf, uint64(n))
	c.raw(c.buf)
}

func (c *cacheWriter) field(num protowire.Number, b []byte) {
	c.tag(num, len(b))
	c.raw(b)
}

func decodeCache(b []byte) (cacheHeader, cacheSnapshot, error) {
	var h cacheHeader
	s := cacheSnapshot{sotw: map[string]sotwEntry{}, delta: map[string]deltaSnapshot{}}
	if len(b) < len(cacheMagic)+checksumSize || string(b[:len(cacheMagic)]) != cacheMagic {
		return h, s, fmt.Errorf("%w: not a meshagent xDS cache (bad magic or too short)", errCacheFile)
	}
	body, sum := b[:len(b)-checksumSize], b[len(b)-checksumSize:]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(sum) {
		return h, s, fmt.Errorf("%w: checksum mismatch (truncated or corrupt)", errCacheFile)
	}
	p := body[len(cacheMagic):]
	seenHeader := false
	for fd, err := range rawxds.Fields(p, protowire.BytesType) {
		if err != nil {
			return h, s, fmt.Errorf("%w: malformed payload", errCacheFile)
		}
		switch fd.Num {
		case 1:
			seenHeader = true
			h.nodeID = rawxds.FirstString(fd.V, 1)
			h.address = rawxds.FirstString(fd.V, 2)
			h.mode = cacheMode(rawxds.FirstVarint(fd.V, 3))
			h.written = time.Unix(0, int64(rawxds.FirstVarint(fd.V, 4)))
		case 2:
			if err := decodeEntry(fd.V, h.mode, &s); err != nil {
				return h, s, err
			}
		case 3:
			s.names = &namesEntry{version: rawxds.FirstString(fd.V, 1), b: []byte(rawxds.FirstString(fd.V, 2))}
		}
	}
	if !seenHeader || h.mode > modeDelta {
		return h, s, fmt.Errorf("%w: no valid header", errCacheFile)
	}
	s.mode = h.mode
	return h, s, nil
}

func decodeEntry(e []byte, mode cacheMode, s *cacheSnapshot) error {
	var typeURL, version string
	var sotwBody []byte
	res := map[string]deltaRes{}
	for fd, err := range rawxds.Fields(e, protowire.BytesType) {
		if err != nil {
			return fmt.Errorf("%w: malformed entry", errCacheFile)
		}
		switch fd.Num {
		case 1:
			typeURL = string(fd.V)
		case 2:
			version = string(fd.V)
		case 3:
			sotwBody = bytes.Clone(fd.V)
		case 4:
			info, err := rawxds.ScanResource(fd.V)
			if err != nil {
				return fmt.Errorf("%w: %s: %v", errCacheFile, typeURL, err)
			}
			res[info.Name] = deltaRes{version: info.Version, b: bytes.Clone(fd.V)}
		}
	}
	if typeURL == "" {
		return fmt.Errorf("%w: entry without a type URL", errCacheFile)
	}
	switch mode {
	case modeSotW:
		f := rawxds.Frame{Body: rawxds.Body{sotwBody}}
		if err := f.Scan(); err != nil || f.TypeURL != typeURL {
			return fmt.Errorf("%w: %s: bad response", errCacheFile, typeURL)
		}
		s.sotw[typeURL] = sotwEntry{b: rawxds.Body{sotwBody}, version: version}
	case modeDelta:
		s.delta[typeURL] = deltaSnapshot{version: version, res: res}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// readCacheFile loads the cache file for this node and control plane,
// reading at most max bytes. A missing file is (zero, nil); an unusable
// one an errCacheFile saying why: errCacheUntrusted for a file another
// user could have written, boundedfile.ErrNotRegular for something that
// is not a file (a FIFO hung the service at start: issue #21),
// boundedfile.ErrTooLarge past max (the bound applied only when writing,
// and a 1 GiB file cost 1 GB before it was rejected).
func readCacheFile(path, nodeID, address string, max int64) (cacheHeader, cacheSnapshot, error) {
	f, fi, err := boundedfile.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cacheHeader{}, cacheSnapshot{}, nil
	}
	if err != nil {
		return cacheHeader{}, cacheSnapshot{}, fmt.Errorf("%w: %w", errCacheFile, err)
	}
	defer f.Close()
	if err := trusted(fi); err != nil {
		return cacheHeader{}, cacheSnapshot{}, fmt.Errorf("%w: %w", errCacheFile, err)
	}
	b, err := boundedfile.ReadOpen(f, fi, max)
	if err != nil {
		return cacheHeader{}, cacheSnapshot{}, fmt.Errorf("%w: %w", errCacheFile, err)
	}
	h, s, err := decodeCache(b)
	if err != nil {
		return h, s, err
	}
	if h.nodeID != nodeID {
		return h, s, fmt.Errorf("%w: written for node %q, this agent is node %q", errCacheFile, h.nodeID, nodeID)
	}
	if h.address != address {
		return h, s, fmt.Errorf("%w: written for control plane %q, this agent uses %q", errCacheFile, h.address, address)
	}
	return h, s, nil
}

// trusted accepts a file only the agent's user could have written: owned
// by the effective uid, neither group- nor world-writable (the agent
// writes it 0600).
func trusted(fi fs.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%w: cannot tell its owner", errCacheUntrusted)
	}
	if int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w: mode %v, owner uid %d gid %d; the agent runs as uid %d and writes it 0600",
			errCacheUntrusted, fi.Mode().Perm(), st.Uid, st.Gid, os.Geteuid())
	}
	return nil
}

// writeCacheFile writes the cache atomically (0600), so that a crash
// leaves either the old file or the new one, never half of one.
func writeCacheFile(path string, write func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	return atomicfile.WriteFunc(path, 0o600, func(w io.Writer) error {
		bw := bufio.NewWriterSize(w, 256<<10)
		if err := write(bw); err != nil {
			return err
		}
		return bw.Flush()
	})
}
