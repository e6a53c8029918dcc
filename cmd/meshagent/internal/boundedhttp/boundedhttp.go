// Package boundedhttp is how the CLI reads an answer from a local server
// it does not trust to be well (#33): Envoy's admin API, the agent's
// status server, whatever listens on their ports. Every body is read with
// a bound, a body past it is an error that names the bound ("answer cut
// at 64 MiB"), never a silent cut that a decoder then calls "unexpected
// EOF", and an error answer is quoted by its first KiB only. `meshagent
// request` ran out of memory in 2-3 s against an endless body, and printed
// a 10 MiB error body whole.
package boundedhttp

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// ErrCut: the answer was longer than the bound the caller gave.
var ErrCut = errors.New("answer cut")

// maxResponseHeaderBytes bounds an answer's headers (Go's default is
// 10 MiB): Envoy's admin and the status server send a few hundred bytes.
const maxResponseHeaderBytes = 1 << 20

// ExcerptBytes is how much of an error answer's body an error quotes.
const ExcerptBytes = 1 << 10

// Client is an http.Client for the local servers: timeout bounds the
// whole exchange, headers are bounded, and no proxy from the environment
// is used (these are the pod's own ports).
func Client(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
		DisableKeepAlives:      true,
	}}
}

// chunk is the step by which Read grows: a body is kept as chunks and
// joined once, so that an endless body costs the bound and a chunk, not
// the doublings of io.ReadAll (up to twice and a quarter the bound).
const chunk = 1 << 20

// Read returns the whole of r if it is at most max bytes; a longer one is
// ErrCut naming the bound, after max+1 bytes were read.
func Read(r io.Reader, max int64) ([]byte, error) {
	var chunks [][]byte
	var n int64
	for {
		size := min(chunk, max+1-n)
		if size <= 0 {
			return nil, cut(max)
		}
		buf := make([]byte, size)
		m, err := io.ReadFull(r, buf)
		chunks = append(chunks, buf[:m])
		n += int64(m)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if n > max {
		return nil, cut(max)
	}
	if len(chunks) == 1 {
		return chunks[0], nil
	}
	out := make([]byte, 0, n)
	for _, c := range chunks {
		out = append(out, c...)
	}
	return out, nil
}

// Copy writes r to w, at most max bytes; a longer r is ErrCut naming the
// bound once max bytes were written (w has them).
func Copy(w io.Writer, r io.Reader, max int64) (int64, error) {
	n, err := io.Copy(w, io.LimitReader(r, max))
	if err != nil {
		return n, err
	}
	if n == max {
		var one [1]byte
		if m, _ := io.ReadFull(r, one[:]); m > 0 {
			return n, cut(max)
		}
	}
	return n, nil
}

// Excerpt is the start of an error answer's body for a message: at most
// ExcerptBytes, trimmed, with a note when there was more.
func Excerpt(r io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(r, ExcerptBytes+1))
	more := len(b) > ExcerptBytes
	if more {
		b = b[:ExcerptBytes]
	}
	s := strings.TrimSpace(strings.ToValidUTF8(string(b), "\uFFFD"))
	if more {
		s += fmt.Sprintf(" ... (answer cut at its first %d bytes)", ExcerptBytes)
	}
	return s
}

func cut(max int64) error {
	return fmt.Errorf("%w at %s (the bound)", ErrCut, Size(max))
}

// Size says a number of bytes as a person would: "64 MiB", "4 KiB".
func Size(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
