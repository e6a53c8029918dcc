package testkit

import (
	"fmt"
	"strings"
)

// diffLinesShown bounds LineDiff: after an inserted line every later line
// differs, and the first few say what happened.
const diffLinesShown = 10

// LineDiff names the lines where got differs from want (a golden file),
// line by line, the first diffLinesShown of them; "" when they are equal.
func LineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var sb strings.Builder
	shown, more := 0, 0
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl == gl {
			continue
		}
		if shown == diffLinesShown {
			more++
			continue
		}
		shown++
		fmt.Fprintf(&sb, "line %d:\n  want: %s\n  got:  %s\n", i+1, wl, gl)
	}
	if more > 0 {
		fmt.Fprintf(&sb, "(and %d more lines)\n", more)
	}
	return sb.String()
}
