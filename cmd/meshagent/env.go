package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// envReader reads typed environment variables and collects every bad value,
// so that one validation step reports them all, each naming its variable.
type envReader struct {
	lookup  func(string) (string, bool)
	environ func() []string // for prefixed variables; nil: none
	errs    []error
}

func (e *envReader) str(key, def string) string {
	if v, ok := e.lookup(key); ok && v != "" {
		return v
	}
	return def
}

func (e *envReader) boolean(key string, def bool) bool {
	v, ok := e.lookup(key)
	if !ok || v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: want true or false", key, v))
		return def
	}
	return b
}

func (e *envReader) duration(key string, def time.Duration) time.Duration {
	v, ok := e.lookup(key)
	if !ok || v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: want a duration such as 5s", key, v))
		return def
	}
	return d
}

func (e *envReader) integer(key string, def int) int {
	v, ok := e.lookup(key)
	if !ok || v == "" {
		return def
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: want a whole number, 0 or more", key, v))
		return def
	}
	return n
}

func (e *envReader) err() error { return errors.Join(e.errs...) }

// prefixed returns every variable whose name starts with prefix, keyed by
// the rest of the name (CA_HEADER_X-Foo=bar ⇒ "X-Foo": "bar").
func (e *envReader) prefixed(prefix string) map[string]string {
	out := map[string]string{}
	if e.environ == nil {
		return out
	}
	for _, kv := range e.environ() {
		k, v, ok := strings.Cut(kv, "=")
		if ok && strings.HasPrefix(k, prefix) && len(k) > len(prefix) {
			out[strings.TrimPrefix(k, prefix)] = v
		}
	}
	return out
}

func (e *envReader) float(key string, def float64) float64 {
	v, ok := e.lookup(key)
	if !ok || v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: want a number", key, v))
		return def
	}
	return f
}
