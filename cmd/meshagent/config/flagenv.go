package config

// Flags, and the variables that stand in for them: the command line, else
// the first of the flag's variables that is set, else the default — the
// first variable's table default (consul-dataplane's cmd/consul-dataplane/
// flags.go). A flag is defined with flagVar (no variable), envFlagVar
// (bound to entries of the table) or optionalFlagVar; the same parser
// turns a flag's text and a variable's text into the value, and every bad
// value is collected in Problems, naming the flag or variable and the
// value, so that one run reports them all (exit code 2).

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// flagSpec names a flag.
type flagSpec struct {
	name, short, usage string
}

// Settings are the flags of one command, bound to their environment
// variables. Define them with flagVar, envFlagVar and optionalFlagVar,
// parse the command line, then call Resolve with the environment.
type Settings struct {
	fs       *pflag.FlagSet
	Problems *Problems
	// fromEnv sets the flags that were not given from their variables.
	fromEnv []func(*Reader)
}

func NewSettings(fs *pflag.FlagSet) *Settings {
	return &Settings{fs: fs, Problems: &Problems{}}
}

// Resolve applies the environment to every flag the command line did not
// give, and returns every bad value, of flags and variables alike.
func (s *Settings) Resolve(env *Reader) error {
	for _, apply := range s.fromEnv {
		apply(env)
	}
	return s.Problems.Err()
}

// flagVar defines a flag with no variable: the command line's value, else
// def.
func flagVar[T any](s *Settings, p *T, def T, parse parseFunc[T], spec flagSpec) {
	*p = def
	defineFlag(s, spec, fmt.Sprint(def), func(v T) { *p = v }, parse, nil)
}

// envFlagVar defines a flag whose value is the command line's, else the
// first of env that is set, else env[0]'s default; it parses as env[0]
// does. The variables are named in --help.
func envFlagVar[T any](s *Settings, p *T, spec flagSpec, env ...*envVar[T]) {
	*p = env[0].Default
	defineFlag(s, spec, env[0].kind.format(env[0].Default), func(v T) { *p = v }, env[0].kind.parse, env)
}

// optionalFlagVar defines a flag whose value stays nil unless the command
// line or one of env gives it: "not set" is visible, and differs from a
// zero (consul-dataplane's pointer fields).
func optionalFlagVar[T any](s *Settings, p **T, parse parseFunc[T], spec flagSpec, env ...*envVar[T]) {
	*p = nil
	defineFlag(s, spec, "", func(v T) { *p = &v }, parse, env)
}

func defineFlag[T any](s *Settings, spec flagSpec, defText string, set func(T), parse parseFunc[T], env []*envVar[T]) {
	usage := spec.usage
	if len(env) > 0 {
		names := make([]string, len(env))
		for i, e := range env {
			names[i] = e.Name
		}
		usage += " (env " + strings.Join(names, ", ") + ")"
	}
	if defText == "-" {
		defText = ""
	}
	v := &flagValue[T]{name: spec.name, text: defText, set: set, parse: parse, problems: s.Problems}
	f := s.fs.VarPF(v, spec.name, spec.short, usage)
	if v.Type() == "bool" {
		f.NoOptDefVal = "true" // --chaos alone means true, as a pflag bool
	}
	if len(env) == 0 {
		return
	}
	s.fromEnv = append(s.fromEnv, func(r *Reader) {
		if s.fs.Changed(spec.name) {
			return
		}
		for _, e := range env {
			val, ok, err := read(r, e)
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
	parse    parseFunc[T]
	problems *Problems
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
