package main

import (
	"errors"
	"slices"
	"testing"
)

// --level as istioctl reads it (#35): LEVEL for all loggers, first;
// LOGGER:LEVEL or LOGGER=LEVEL for one; a namespaced logger (a::b:LEVEL)
// by its last name; warn is Envoy's warning; a bad level is a usage error
// before Envoy is asked.
func TestLogLevelQueries(t *testing.T) {
	for value, want := range map[string][]string{
		"debug":                    {"level=debug"},
		"http:debug,router=trace":  {"http=debug", "router=trace"},
		"http:debug,warn":          {"level=warning", "http=debug"},
		"envoy::http:info":         {"http=info"},
		"level:off":                {"level=off"},
		"misc:error,upstream:info": {"misc=error", "upstream=info"},
	} {
		got, err := logLevelQueries(value)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("--level %q: %q, %v; want %q", value, got, err, want)
		}
	}
	for _, bad := range []string{"loud", "http:loud", "http:", ""} {
		_, err := logLevelQueries(bad)
		var exit *exitError
		if !errors.As(err, &exit) || exit.code != 2 {
			t.Errorf("--level %q: %v; want a usage error (exit 2)", bad, err)
		}
	}
}
