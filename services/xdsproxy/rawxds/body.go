package rawxds

import (
	"errors"
	"fmt"
	"iter"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// A response as gRPC received it, in pieces, and the reading of its
// fields across them (#24: the package comment says why it is never joined).

// Body is a message as gRPC received it: its pieces, in order. A piece is
// never modified, nor recycled while the Body is held: the upstream
// connection's receive buffers are not pooled (xdsproxy's upstream.go).
type Body [][]byte

// Len is the message's size.
func (b Body) Len() int {
	n := 0
	for _, p := range b {
		n += len(p)
	}
	return n
}

// Bytes is the message in one slice: its one piece, or a copy of them
// joined (the agent's own types, which are small; debug logs; tests).
func (b Body) Bytes() []byte {
	if len(b) == 1 {
		return b[0]
	}
	out := make([]byte, 0, b.Len())
	for _, p := range b {
		out = append(out, p...)
	}
	return out
}

// bodyFields is Fields(b, protowire.BytesType) for a message in pieces:
// the values of the field numbers keep accepts are sub-slices of a piece,
// or copies when they span two; the others are skipped (v nil).
func bodyFields(b Body, keep func(protowire.Number) bool) iter.Seq2[Field, error] {
	return func(yield func(Field, error) bool) {
		c := cursor{b: b, left: b.Len()}
		for !c.done() {
			num, typ, err := c.tag()
			if err == nil && typ != protowire.BytesType {
				err = c.skip(num, typ, 0)
			}
			if err != nil {
				yield(Field{}, err)
				return
			}
			if typ != protowire.BytesType {
				continue
			}
			n, err := c.length()
			var v []byte
			if err == nil {
				v, err = c.next(n, keep(num))
			}
			if err != nil {
				yield(Field{}, fmt.Errorf("field %d: %w", num, err))
				return
			}
			if !yield(Field{Num: num, V: v}, nil) {
				return
			}
		}
	}
}

// cursor reads a body in order.
type cursor struct {
	b    Body
	i    int // the piece
	off  int // in it
	left int // bytes not read yet
}

var errTruncated = errors.New("unexpected end of message")

func (c *cursor) done() bool { return c.left == 0 }

// settle moves past the pieces read to their end (and empty ones): the
// next byte, if any is left, is c.b[c.i][c.off].
func (c *cursor) settle() {
	for c.i < len(c.b) && c.off == len(c.b[c.i]) {
		c.i, c.off = c.i+1, 0
	}
}

func (c *cursor) byte() (byte, error) {
	c.settle()
	if c.left == 0 {
		return 0, errTruncated
	}
	x := c.b[c.i][c.off]
	c.off++
	c.left--
	return x, nil
}

// varint reads a varint of at most 10 bytes, as protowire does.
func (c *cursor) varint() (uint64, error) {
	var v uint64
	for i := range 10 {
		x, err := c.byte()
		if err != nil {
			return 0, err
		}
		if i == 9 && x > 1 {
			break
		}
		v |= uint64(x&0x7f) << (7 * i)
		if x < 0x80 {
			return v, nil
		}
	}
	return 0, errors.New("varint overflow")
}

func (c *cursor) tag() (protowire.Number, protowire.Type, error) {
	v, err := c.varint()
	if err != nil {
		return 0, 0, err
	}
	// protowire.ConsumeTag's bounds.
	if v>>3 > math.MaxInt32 || v>>3 < uint64(protowire.MinValidNumber) {
		return 0, 0, fmt.Errorf("invalid field number %d", v>>3)
	}
	return protowire.Number(v >> 3), protowire.Type(v & 7), nil
}

// length reads a length-delimited field's length.
func (c *cursor) length() (int, error) {
	v, err := c.varint()
	if err != nil {
		return 0, err
	}
	if v > uint64(c.left) {
		return 0, errTruncated
	}
	return int(v), nil
}

// next reads n bytes: a sub-slice of a piece, or a copy when they span
// pieces; nil when !keep.
func (c *cursor) next(n int, keep bool) ([]byte, error) {
	if n > c.left {
		return nil, errTruncated
	}
	c.settle()
	if n == 0 || len(c.b[c.i])-c.off >= n {
		var v []byte
		if keep && n > 0 {
			v = c.b[c.i][c.off : c.off+n : c.off+n]
		}
		c.off += n
		c.left -= n
		return v, nil
	}
	var out []byte
	if keep {
		out = make([]byte, 0, n)
	}
	for n > 0 {
		c.settle()
		k := min(n, len(c.b[c.i])-c.off)
		if keep {
			out = append(out, c.b[c.i][c.off:c.off+k]...)
		}
		c.off += k
		c.left -= k
		n -= k
	}
	return out, nil
}

// maxGroupDepth bounds nested groups, as protowire's recursion limit does.
const maxGroupDepth = 10000

// skip skips the value of a field of type typ (not bytes), groups included.
func (c *cursor) skip(num protowire.Number, typ protowire.Type, depth int) error {
	switch typ {
	case protowire.VarintType:
		_, err := c.varint()
		return err
	case protowire.Fixed32Type:
		_, err := c.next(4, false)
		return err
	case protowire.Fixed64Type:
		_, err := c.next(8, false)
		return err
	case protowire.BytesType:
		n, err := c.length()
		if err == nil {
			_, err = c.next(n, false)
		}
		return err
	case protowire.StartGroupType:
		if depth == maxGroupDepth {
			return errors.New("groups nested too deep")
		}
		for {
			n, t, err := c.tag()
			if err != nil {
				return err
			}
			if t == protowire.EndGroupType {
				if n != num {
					return fmt.Errorf("group %d ended as %d", num, n)
				}
				return nil
			}
			if err := c.skip(n, t, depth+1); err != nil {
				return err
			}
		}
	}
	return fmt.Errorf("field %d: unexpected wire type %d", num, typ)
}
