package unique

import (
	"slices"
	"testing"
)

func TestValuesKeepsFirstAppearances(t *testing.T) {
	in := []string{"b", "a", "b", "c", "a"}
	if got := Values(in); !slices.Equal(got, []string{"b", "a", "c"}) {
		t.Fatalf("Values(%q) = %q, want [b a c]", in, got)
	}
	if !slices.Equal(in, []string{"b", "a", "b", "c", "a"}) {
		t.Fatalf("the input changed: %q", in)
	}
	if got := Values[string](nil); len(got) != 0 {
		t.Fatalf("Values(nil) = %q", got)
	}
}
