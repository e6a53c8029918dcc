package boundedhttp

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// endless is a reader that never ends.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

func TestReadCutsAtTheBoundAndSaysSo(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    io.Reader
		max  int64
		want int
		err  string
	}{
		{"short", strings.NewReader("hello"), 10, 5, ""},
		{"at the bound", strings.NewReader(strings.Repeat("y", 3<<20)), 3 << 20, 3 << 20, ""},
		{"empty", strings.NewReader(""), 10, 0, ""},
		{"one past", strings.NewReader(strings.Repeat("y", 2<<20+1)), 2 << 20, 0, "answer cut at 2 MiB (the bound)"},
		{"endless", endless{}, 4 << 10, 0, "answer cut at 4 KiB (the bound)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Read(tc.r, tc.max)
			if tc.err == "" {
				if err != nil || len(b) != tc.want {
					t.Fatalf("Read = %d bytes, %v; want %d", len(b), err, tc.want)
				}
				return
			}
			if !errors.Is(err, ErrCut) || err.Error() != tc.err {
				t.Fatalf("Read = %v; want %q", err, tc.err)
			}
		})
	}
}

func TestCopyCutsAtTheBound(t *testing.T) {
	var out bytes.Buffer
	if n, err := Copy(&out, strings.NewReader("12345"), 5); err != nil || n != 5 || out.String() != "12345" {
		t.Fatalf("Copy at the bound = %d, %v, %q", n, err, out.String())
	}
	out.Reset()
	if n, err := Copy(&out, endless{}, 1000); !errors.Is(err, ErrCut) || n != 1000 || !strings.Contains(err.Error(), "1000 bytes (the bound)") {
		t.Fatalf("Copy of an endless reader = %d, %v", n, err)
	}
}

func TestExcerptQuotesTheStart(t *testing.T) {
	if got := Excerpt(strings.NewReader("  not ready\n")); got != "not ready" {
		t.Fatalf("Excerpt = %q", got)
	}
	got := Excerpt(endless{})
	if len(got) > ExcerptBytes+100 || !strings.HasSuffix(got, "(answer cut at its first 1024 bytes)") {
		t.Fatalf("Excerpt of an endless body = %d bytes ending %q", len(got), got[len(got)-50:])
	}
}
