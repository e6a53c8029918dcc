package main

// The one way a setting is read: the command line, else its environment
// variable, else its default (consul-dataplane's cmd/consul-dataplane/
// flags.go). Flags are defined with flagVar or optionalFlagVar, environment-
// only settings read with envVar or optionalEnvVar; the same parser turns a
// flag's text and a variable's text into the value, and every bad value is
// collected in problems, naming the flag or variable and the value, so that
// one run reports them all (exit code 2).

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// environment is the process environment as the configuration sees it: a
// lookup, and the whole list for prefixed variables (ISTIO_META_*,
// CA_HEADER_*). An empty value counts as unset, as a Kubernetes `value: ""`
// usually means.
type environment struct {
	lookup func(string) (string, bool)
	list   func() []string
}

// get returns the variable's value and whether it is set and not empty.
func (e environment) get(name string) (string, bool) {
	if e.lookup == nil {
		return "", false
	}
	v, ok := e.lookup(name)
	return v, ok && v != ""
}

// all is the environment as NAME=value lines.
func (e environment) all() []string {
	if e.list == nil {
		return nil
	}
	return e.list()
}

// prefixed returns every variable whose name starts with prefix, keyed by
// the rest of the name (CA_HEADER_X-Foo=bar ⇒ "X-Foo": "bar").
func (e environment) prefixed(prefix string) map[string]string {
	out := map[string]string{}
	for _, kv := range e.all() {
		k, v, ok := strings.Cut(kv, "=")
		if ok && len(k) > len(prefix) && strings.HasPrefix(k, prefix) {
			out[k[len(prefix):]] = v
		}
	}
	return out
}

// mapEnvironment is an environment made of a map: tests, and the capture
// settings of `proxy` that read no flags.
func mapEnvironment(m map[string]string) environment {
	return environment{
		lookup: func(k string) (string, bool) { v, ok := m[k]; return v, ok },
		list: func() []string {
			out := make([]string, 0, len(m))
			for k, v := range m {
				out = append(out, k+"="+v)
			}
			return out
		},
	}
}

// problems collects bad values, each naming where it came from (a flag, an
// environment variable, a file) and the value.
type problems struct{ errs []error }

func (p *problems) add(err error) {
	if err != nil {
		p.errs = append(p.errs, err)
	}
}

func (p *problems) addf(format string, args ...any) { p.add(fmt.Errorf(format, args...)) }

// err is every problem, joined; nil if there was none.
func (p *problems) err() error { return errors.Join(p.errs...) }

// maxShownValue bounds how much of a bad value an error repeats: a 100 KB
// variable must not become a 100 KB error line (#21). The start and the end
// are kept, where a path or a suffix usually says what went wrong.
const maxShownValue = 120

// quoteValue is a flag's or a variable's text as an error shows it: quoted,
// and cut in the middle when long, with its length.
func quoteValue(s string) string {
	if len(s) <= maxShownValue {
		return strconv.Quote(s)
	}
	const tail = maxShownValue / 4
	return fmt.Sprintf("%s…%s (%d bytes)", strconv.Quote(s[:maxShownValue-tail]), strconv.Quote(s[len(s)-tail:]), len(s))
}

// parser turns a flag's or a variable's text into a value, or says what a
// good value looks like.
type parser[T any] func(string) (T, error)

func parseString(s string) (string, error) { return s, nil }

func parseBool(s string) (bool, error) {
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return false, errors.New("want true or false")
	}
	return b, nil
}

// parseCount is a whole number, 0 or more.
func parseCount(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 {
		return 0, errors.New("want a whole number, 0 or more")
	}
	return n, nil
}

// parsePort is a TCP/UDP port, 1-65535.
func parsePort(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 1 || n > math.MaxUint16 {
		return 0, errors.New("want a port, 1-65535")
	}
	return n, nil
}

// parseDuration is a Go duration, 0 or more ("5s", "100ms").
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil || d < 0 {
		return 0, errors.New("want a duration such as 5s")
	}
	return d, nil
}

func parseFloat(s string) (float64, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return 0, errors.New("want a number")
	}
	return f, nil
}

// flagSpec names a flag and the environment variables that stand in for it
// when it is not given (the first one set wins).
type flagSpec struct {
	name, short string
	env         []string
	usage       string
}

// settings are the flags of one command, bound to their environment
// variables. Define them with flagVar and optionalFlagVar, parse the
// command line, then call resolve with the environment.
type settings struct {
	fs       *pflag.FlagSet
	problems *problems
	// fromEnv sets the flags that were not given from their variables.
	fromEnv []func(environment)
}

func newSettings(fs *pflag.FlagSet) *settings {
	return &settings{fs: fs, problems: &problems{}}
}

// resolve applies the environment to every flag the command line did not
// give, and returns every bad value, of flags and variables alike.
func (s *settings) resolve(env environment) error {
	for _, apply := range s.fromEnv {
		apply(env)
	}
	return s.problems.err()
}

// flagVar defines a flag whose value is the command line's, else the first
// of spec.env that is set, else def. The variables are named in --help.
func flagVar[T any](s *settings, p *T, def T, parse parser[T], spec flagSpec) {
	*p = def
	defineFlag(s, spec, fmt.Sprint(def), func(v T) { *p = v }, parse)
}

// optionalFlagVar defines a flag whose value stays nil unless the command
// line or one of spec.env gives it: "not set" is visible, and differs from
// a zero (consul-dataplane's pointer fields).
func optionalFlagVar[T any](s *settings, p **T, parse parser[T], spec flagSpec) {
	*p = nil
	defineFlag(s, spec, "", func(v T) { *p = &v }, parse)
}

func defineFlag[T any](s *settings, spec flagSpec, defText string, set func(T), parse parser[T]) {
	usage := spec.usage
	if len(spec.env) > 0 {
		usage += " (env " + strings.Join(spec.env, ", ") + ")"
	}
	v := &flagValue[T]{name: spec.name, text: defText, set: set, parse: parse, problems: s.problems}
	f := s.fs.VarPF(v, spec.name, spec.short, usage)
	if v.Type() == "bool" {
		f.NoOptDefVal = "true" // --chaos alone means true, as a pflag bool
	}
	s.fromEnv = append(s.fromEnv, func(env environment) {
		if s.fs.Changed(spec.name) {
			return
		}
		for _, name := range spec.env {
			text, ok := env.get(name)
			if !ok {
				continue
			}
			if val, err := parse(text); err != nil {
				s.problems.addf("%s=%s: %v", name, quoteValue(text), err)
			} else {
				set(val)
			}
			return
		}
	})
}

// flagValue is a flag of any type: its text goes through the same parser
// as its variables'. A bad value is collected, not returned, so that the
// command line is parsed to its end and every bad value reported at once.
type flagValue[T any] struct {
	name     string
	text     string
	set      func(T)
	parse    parser[T]
	problems *problems
}

func (v *flagValue[T]) String() string { return v.text }

func (v *flagValue[T]) Set(text string) error {
	v.text = text
	val, err := v.parse(text)
	if err != nil {
		v.problems.addf("--%s %s: %v", v.name, quoteValue(text), err)
		return nil
	}
	v.set(val)
	return nil
}

// Type is what --help shows after the flag's name.
func (v *flagValue[T]) Type() string {
	switch any(*new(T)).(type) {
	case bool:
		return "bool"
	case int:
		return "int"
	case time.Duration:
		return "duration"
	case float64:
		return "float"
	default:
		return "string"
	}
}

// envReader reads environment-only settings, collecting bad values.
type envReader struct {
	env      environment
	problems *problems
}

// envVar is the variable's value, else def.
func envVar[T any](r envReader, name string, def T, parse parser[T]) T {
	if v := optionalEnvVar(r, name, parse); v != nil {
		return *v
	}
	return def
}

// optionalEnvVar is the variable's value, or nil when it is not set (or
// not valid: then the problem is collected).
func optionalEnvVar[T any](r envReader, name string, parse parser[T]) *T {
	text, ok := r.env.get(name)
	if !ok {
		return nil
	}
	v, err := parse(text)
	if err != nil {
		r.problems.addf("%s=%s: %v", name, quoteValue(text), err)
		return nil
	}
	return &v
}
