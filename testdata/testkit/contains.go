package testkit

import (
	"strings"
	"testing"
)

// Contains checks that got, what the test calls what, holds every one of
// wants, and reports each one missing with the whole of got: the test
// goes on, to show every missing part at once.
func Contains(t testing.TB, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, got)
		}
	}
}
