package config

import (
	"strings"
	"testing"
)

// A bad value is shown whole when short, else its start and end and its
// length: a 100 KB variable makes a short error (#21).
func TestQuoteValueCutsLongValues(t *testing.T) {
	if got := QuoteValue("maybe"); got != `"maybe"` {
		t.Errorf("QuoteValue(maybe) = %s", got)
	}
	long := "start" + strings.Repeat("x", 100*1024) + "end"
	got := QuoteValue(long)
	if len(got) > 2*maxShownValue || !strings.HasPrefix(got, `"start`) || !strings.Contains(got, `end" (102408 bytes)`) {
		t.Errorf("QuoteValue(100 KB) = %s", got)
	}
}
