package lkg

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

// ErrFile wraps every reason a cache file is not used.
var ErrFile = errors.New("cache file not usable")

// ErrUntrusted: the file could have been written by someone other
// than the agent's user (group- or world-writable, or another owner). It
// is not the agent's file, so it is neither served nor removed (issue
// #21: such a file was loaded and served without a word).
var ErrUntrusted = errors.New("cache file could have been written by another user")

// Header says whose the file is (node and control plane), which protocol
// its configuration is of, and when it was written.
type Header struct {
	NodeID  string
	Address string
	Mode    Mode
	Written time.Time
}

// FileSize is the size of the file image of s, without building it.
func FileSize(h Header, s Snapshot) int64 {
	n := int64(len(cacheMagic) + checksumSize)
	n += fieldSize(len(encodeHeader(h, s.Mode)))
	for _, t := range sortedKeys(s.SotW) {
		n += fieldSize(entrySize(t, s.SotW[t].Version, s.SotW[t].Response, nil))
	}
	for _, t := range sortedKeys(s.Delta) {
		n += fieldSize(entrySize(t, s.Delta[t].Version, nil, s.Delta[t].Resources))
	}
	if s.Names != nil {
		n += fieldSize(namesSize(s.Names))
	}
	return n
}

func namesSize(e *NamesEntry) int {
	return int(fieldSize(len(e.Version)) + fieldSize(len(e.Table)))
}

// fieldSize is the size of a length-delimited field of n bytes (field
// numbers here are all below 16: a one-byte tag).
func fieldSize(n int) int64 { return int64(1 + protowire.SizeVarint(uint64(n)) + n) }

func entrySize(typeURL, version string, sotw rawxds.Body, delta map[string]DeltaRes) int {
	n := int(fieldSize(len(typeURL)) + fieldSize(len(version)))
	if sotw != nil {
		n += int(fieldSize(sotw.Len()))
	}
	for _, r := range delta {
		n += int(fieldSize(len(r.Resource)))
	}
	return n
}

func encodeHeader(h Header, mode Mode) []byte {
	var hdr []byte
	hdr = protowire.AppendTag(hdr, 1, protowire.BytesType)
	hdr = protowire.AppendString(hdr, h.NodeID)
	hdr = protowire.AppendTag(hdr, 2, protowire.BytesType)
	hdr = protowire.AppendString(hdr, h.Address)
	hdr = protowire.AppendTag(hdr, 3, protowire.VarintType)
	hdr = protowire.AppendVarint(hdr, uint64(mode))
	hdr = protowire.AppendTag(hdr, 4, protowire.VarintType)
	return protowire.AppendVarint(hdr, uint64(h.Written.UnixNano()))
}

// Write streams the file image to w: the resources are written from
// the cache's own slices, the checksum computed on the way.
func Write(w io.Writer, h Header, s Snapshot) error {
	sum := crc32.New(castagnoli)
	out := &cacheWriter{w: io.MultiWriter(w, sum)}
	out.raw([]byte(cacheMagic))
	out.field(1, encodeHeader(h, s.Mode))
	entry := func(typeURL, version string, sotw rawxds.Body, delta map[string]DeltaRes) {
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
			out.field(4, r.Resource)
		}
	}
	for _, t := range sortedKeys(s.SotW) {
		entry(t, s.SotW[t].Version, s.SotW[t].Response, nil)
	}
	for _, t := range sortedKeys(s.Delta) {
		entry(t, s.Delta[t].Version, nil, s.Delta[t].Resources)
	}
	if s.Names != nil {
		out.tag(3, namesSize(s.Names))
		out.field(1, []byte(s.Names.Version))
		out.field(2, s.Names.Table)
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

// decode reads a file image: its header and the cache it holds, or an
// ErrFile saying why it is not usable.
func decode(b []byte) (Header, Snapshot, error) {
	var h Header
	s := Snapshot{SotW: map[string]SotWEntry{}, Delta: map[string]DeltaSnapshot{}}
	if len(b) < len(cacheMagic)+checksumSize || string(b[:len(cacheMagic)]) != cacheMagic {
		return h, s, fmt.Errorf("%w: not a meshagent xDS cache (bad magic or too short)", ErrFile)
	}
	body, sum := b[:len(b)-checksumSize], b[len(b)-checksumSize:]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(sum) {
		return h, s, fmt.Errorf("%w: checksum mismatch (truncated or corrupt)", ErrFile)
	}
	p := body[len(cacheMagic):]
	seenHeader := false
	for fd, err := range rawxds.Fields(p, protowire.BytesType) {
		if err != nil {
			return h, s, fmt.Errorf("%w: malformed payload", ErrFile)
		}
		switch fd.Num {
		case 1:
			seenHeader = true
			h.NodeID = rawxds.FirstString(fd.V, 1)
			h.Address = rawxds.FirstString(fd.V, 2)
			h.Mode = Mode(rawxds.FirstVarint(fd.V, 3))
			h.Written = time.Unix(0, int64(rawxds.FirstVarint(fd.V, 4)))
		case 2:
			if err := decodeEntry(fd.V, h.Mode, &s); err != nil {
				return h, s, err
			}
		case 3:
			s.Names = &NamesEntry{Version: rawxds.FirstString(fd.V, 1), Table: []byte(rawxds.FirstString(fd.V, 2))}
		}
	}
	if !seenHeader || h.Mode > ModeDelta {
		return h, s, fmt.Errorf("%w: no valid header", ErrFile)
	}
	s.Mode = h.Mode
	return h, s, nil
}

func decodeEntry(e []byte, mode Mode, s *Snapshot) error {
	var typeURL, version string
	var sotwBody []byte
	res := map[string]DeltaRes{}
	for fd, err := range rawxds.Fields(e, protowire.BytesType) {
		if err != nil {
			return fmt.Errorf("%w: malformed entry", ErrFile)
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
				return fmt.Errorf("%w: %s: %v", ErrFile, typeURL, err)
			}
			res[info.Name] = DeltaRes{Version: info.Version, Resource: bytes.Clone(fd.V)}
		}
	}
	if typeURL == "" {
		return fmt.Errorf("%w: entry without a type URL", ErrFile)
	}
	switch mode {
	case ModeSotW:
		f := rawxds.Frame{Body: rawxds.Body{sotwBody}}
		if err := f.Scan(); err != nil || f.TypeURL != typeURL {
			return fmt.Errorf("%w: %s: bad response", ErrFile, typeURL)
		}
		s.SotW[typeURL] = SotWEntry{Response: rawxds.Body{sotwBody}, Version: version}
	case ModeDelta:
		s.Delta[typeURL] = DeltaSnapshot{Version: version, Resources: res}
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

// ReadFile loads the cache file for this node and control plane,
// reading at most max bytes. A missing file is (zero, nil); an unusable
// one an ErrFile saying why: ErrUntrusted for a file another
// user could have written, boundedfile.ErrNotRegular for something that
// is not a file (a FIFO hung the service at start: issue #21),
// boundedfile.ErrTooLarge past max (the bound applied only when writing,
// and a 1 GiB file cost 1 GB before it was rejected).
func ReadFile(path, nodeID, address string, max int64) (Header, Snapshot, error) {
	f, fi, err := boundedfile.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Header{}, Snapshot{}, nil
	}
	if err != nil {
		return Header{}, Snapshot{}, fmt.Errorf("%w: %w", ErrFile, err)
	}
	defer f.Close()
	if err := trusted(fi); err != nil {
		return Header{}, Snapshot{}, fmt.Errorf("%w: %w", ErrFile, err)
	}
	b, err := boundedfile.ReadOpen(f, fi, max)
	if err != nil {
		return Header{}, Snapshot{}, fmt.Errorf("%w: %w", ErrFile, err)
	}
	h, s, err := decode(b)
	if err != nil {
		return h, s, err
	}
	if h.NodeID != nodeID {
		return h, s, fmt.Errorf("%w: written for node %q, this agent is node %q", ErrFile, h.NodeID, nodeID)
	}
	if h.Address != address {
		return h, s, fmt.Errorf("%w: written for control plane %q, this agent uses %q", ErrFile, h.Address, address)
	}
	return h, s, nil
}

// trusted accepts a file only the agent's user could have written: owned
// by the effective uid, neither group- nor world-writable (the agent
// writes it 0600).
func trusted(fi fs.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%w: cannot tell its owner", ErrUntrusted)
	}
	if int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w: mode %v, owner uid %d gid %d; the agent runs as uid %d and writes it 0600",
			ErrUntrusted, fi.Mode().Perm(), st.Uid, st.Gid, os.Geteuid())
	}
	return nil
}

// WriteFile writes the cache atomically (0600), so that a crash
// leaves either the old file or the new one, never half of one.
func WriteFile(path string, write func(io.Writer) error) error {
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
