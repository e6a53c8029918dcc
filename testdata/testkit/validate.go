package testkit

import "testing"

// EachEditRejected checks a configuration's Validate both ways: good
// passes, and each named edit of a copy of good fails.
func EachEditRejected[C interface{ Validate() error }](t testing.TB, good C, edits map[string]func(*C)) {
	t.Helper()
	if err := good.Validate(); err != nil {
		t.Fatalf("the good configuration: %v", err)
	}
	for name, edit := range edits {
		c := good
		edit(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
