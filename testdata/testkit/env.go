package testkit

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The settings of a test or bench driver from the environment: a bad
// value fails the test at once, naming the variable, before anything
// costly (a node, a storm) starts.

// EnvInt is the environment variable name, a number of what at least
// least, or def when it is unset or empty.
func EnvInt(t testing.TB, name string, def, least int, what string) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < least {
		t.Fatalf("%s=%q: want a number of %s, at least %d", name, v, what, least)
	}
	return n
}

// EnvChoice is the environment variable name, one of choices, the first
// when it is unset or empty; means says what the choices mean.
func EnvChoice(t testing.TB, name, means string, choices ...string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return choices[0]
	}
	if !slices.Contains(choices, v) {
		t.Fatalf("%s=%q: want one of %s (%s)", name, v, strings.Join(choices, ", "), means)
	}
	return v
}
