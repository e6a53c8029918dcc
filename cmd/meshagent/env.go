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
	lookup func(string) (string, bool)
	errs   []error
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
