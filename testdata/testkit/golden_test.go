package testkit

import (
	"fmt"
	"strings"
	"testing"
)

func TestLineDiff(t *testing.T) {
	if d := LineDiff("a\nb", "a\nb"); d != "" {
		t.Errorf("equal texts: %q", d)
	}
	if d := LineDiff("a\nb\nc", "a\nx"); d != "line 2:\n  want: b\n  got:  x\nline 3:\n  want: c\n  got:  \n" {
		t.Errorf("diff %q", d)
	}
	var want, got []string
	for i := range 30 {
		want, got = append(want, fmt.Sprint(i)), append(got, fmt.Sprint(i+1))
	}
	if d := LineDiff(strings.Join(want, "\n"), strings.Join(got, "\n")); strings.Count(d, "line ") != 10 || !strings.HasSuffix(d, "(and 20 more lines)\n") {
		t.Errorf("a long diff is not cut:\n%s", d)
	}
}
