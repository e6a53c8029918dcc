package config

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
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// MapEnvironment is a reader of an environment made of a map: tests, and
// the layers built on the process environment (the VM's cluster.env).
func MapEnvironment(m map[string]string) *Reader { return NewReader(FromMap(m)) }

// Problems collects bad values, each naming where it came from (a flag, an
// environment variable, a file) and the value.
type Problems struct{ errs []error }

func (p *Problems) Add(err error) {
	if err != nil {
		p.errs = append(p.errs, err)
	}
}

func (p *Problems) Addf(format string, args ...any) { p.Add(fmt.Errorf(format, args...)) }

// err is every problem, joined; nil if there was none.
func (p *Problems) Err() error { return errors.Join(p.errs...) }

// FlagSpec names a flag and the environment variables that stand in for it
// when it is not given (the first one set wins).
type FlagSpec struct {
	name, short string
	Env         []string
	usage       string
}

// Settings are the flags of one command, bound to their environment
// variables. Define them with flagVar and optionalFlagVar, parse the
// command line, then call resolve with the environment.
type Settings struct {
	fs       *pflag.FlagSet
	Problems *Problems
	// fromEnv sets the flags that were not given from their variables.
	fromEnv []func(*Reader)
}

func NewSettings(fs *pflag.FlagSet) *Settings {
	return &Settings{fs: fs, Problems: &Problems{}}
}

// resolve applies the environment to every flag the command line did not
// give, and returns every bad value, of flags and variables alike.
func (s *Settings) Resolve(env *Reader) error {
	for _, apply := range s.fromEnv {
		apply(env)
	}
	return s.Problems.Err()
}

// FlagVar defines a flag whose value is the command line's, else the first
// of spec.env that is set, else def. The variables are named in --help.
func FlagVar[T any](s *Settings, p *T, def T, parse Parser[T], spec FlagSpec) {
	*p = def
	defineFlag(s, spec, fmt.Sprint(def), func(v T) { *p = v }, parse)
}

// OptionalFlagVar defines a flag whose value stays nil unless the command
// line or one of spec.env gives it: "not set" is visible, and differs from
// a zero (consul-dataplane's pointer fields).
func OptionalFlagVar[T any](s *Settings, p **T, parse Parser[T], spec FlagSpec) {
	*p = nil
	defineFlag(s, spec, "", func(v T) { *p = &v }, parse)
}

func defineFlag[T any](s *Settings, spec FlagSpec, defText string, set func(T), parse Parser[T]) {
	usage := spec.usage
	if len(spec.Env) > 0 {
		usage += " (env " + strings.Join(spec.Env, ", ") + ")"
	}
	v := &flagValue[T]{name: spec.name, text: defText, set: set, parse: parse, problems: s.Problems}
	f := s.fs.VarPF(v, spec.name, spec.short, usage)
	if v.Type() == "bool" {
		f.NoOptDefVal = "true" // --chaos alone means true, as a pflag bool
	}
	s.fromEnv = append(s.fromEnv, func(env *Reader) {
		if s.fs.Changed(spec.name) {
			return
		}
		for _, name := range spec.Env {
			val, ok, err := Value(env, name, parse)
			if err != nil {
				s.Problems.Add(err)
				return
			}
			if ok {
				set(val)
				return
			}
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
	parse    Parser[T]
	problems *Problems
}

func (v *flagValue[T]) String() string { return v.text }

func (v *flagValue[T]) Set(text string) error {
	v.text = text
	val, err := v.parse(text)
	if err != nil {
		v.problems.Addf("--%s %s: %v", v.name, QuoteValue(text), err)
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
	env      *Reader
	problems *Problems
}

// envVar is the variable's value, else def.
func envVar[T any](r envReader, name string, def T, parse Parser[T]) T {
	if v := optionalEnvVar(r, name, parse); v != nil {
		return *v
	}
	return def
}

// optionalEnvVar is the variable's value, or nil when it is not set (or
// not valid: then the problem is collected).
func optionalEnvVar[T any](r envReader, name string, parse Parser[T]) *T {
	v, ok, err := Value(r.env, name, parse)
	r.problems.Add(err)
	if !ok {
		return nil
	}
	return &v
}
