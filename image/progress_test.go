package image

import (
	"bytes"
	"strings"
	"testing"
)

// On a terminal a step shows its bytes live, rewritten in place, then its
// line; elsewhere (a CI log) only the line: one per step.
func TestProgressLiveOnlyOnATerminal(t *testing.T) {
	for _, terminal := range []bool{true, false} {
		var out bytes.Buffer
		p := &progress{w: &out, terminal: terminal}
		c := p.counter("linux/amd64: layer 1/3", 3<<20)
		chunk := make([]byte, 64<<10)
		for range 3 << 20 / len(chunk) {
			c.Write(chunk)
		}
		p.done("linux/amd64: layer 1/3", 3<<20)
		got := out.String()
		live := strings.Count(got, "\r\033[K")
		if terminal {
			if !strings.Contains(got, "\r\033[Klinux/amd64: layer 1/3: 1.0 MiB / 3.0 MiB") || live < 3 {
				t.Errorf("terminal: %q, want the bytes shown live", got)
			}
		} else if live != 0 || got != "linux/amd64: layer 1/3: 3.0 MiB\n" {
			t.Errorf("not a terminal: %q, want one line", got)
		}
		if !strings.HasSuffix(got, "linux/amd64: layer 1/3: 3.0 MiB\n") {
			t.Errorf("terminal %v: %q does not end with the step's line", terminal, got)
		}
	}
}
