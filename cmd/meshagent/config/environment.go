package config

// What a variable is, and how it is read: the one way. An entry of the
// table (env.go) is an envVar, or an envPrefix for a family, and help
// prints its row (Var). An Environment is where the text comes from (the
// process's, or a layer built on it: a VM's cluster.env, standalone's
// defaults); a Reader reads it through the entries, each variable once:
// its text parsed by its entry's parser, the value kept, a bad value
// reported to the first reader only. The builders call get or lookup with
// an entry, and a flag's variables are read the same way (flagenv.go).

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
)

// Environment is the process environment as the configuration sees it: a
// lookup, and the whole list for prefixed variables (ISTIO_META_*,
// CA_HEADER_*). Production has one, Process; tests and layers make theirs
// from a map (MapEnvironment).
type Environment struct {
	Lookup func(name string) (string, bool)
	List   func() []string
}

// Process is the agent's own environment: the one place the process
// environment is read (#26).
func Process() Environment { return Environment{Lookup: os.LookupEnv, List: os.Environ} }

// Get returns the variable's value and whether it is set and not empty: an
// empty value counts as unset, as a Kubernetes `value: ""` usually means.
func (e Environment) Get(name string) (string, bool) {
	if e.Lookup == nil {
		return "", false
	}
	v, ok := e.Lookup(name)
	return v, ok && v != ""
}

// All is the environment as NAME=value lines.
func (e Environment) All() []string {
	if e.List == nil {
		return nil
	}
	return e.List()
}

// envVar is one environment variable: its name, its default value, how
// its text becomes a value (kind), the service it feeds and what it means
// (Istio's meaning, unless the doc says it is ours). The builders read it
// only through the entry (get, lookup; a flag's envFlagVar), so the
// default they use is the one help prints.
type envVar[T any] struct {
	Name    string
	Default T
	kind    kind[T]
	Service string
	Doc     string
	// defaultText, when set, is what help prints for a default computed
	// from other settings (PROXY_GID: PROXY_UID's value).
	defaultText string
}

// table is every entry, in the order declared: help's source.
var table []interface{ row() Var }

// setting declares an entry of the table.
func setting[T any](k kind[T], name string, def T, service, doc string) *envVar[T] {
	s := &envVar[T]{Name: name, Default: def, kind: k, Service: service, Doc: doc}
	table = append(table, s)
	return s
}

// derived says, for help, what the default is computed from.
func (s *envVar[T]) derived(text string) *envVar[T] {
	s.defaultText = text
	return s
}

func (s *envVar[T]) row() Var {
	def := s.defaultText
	if def == "" {
		def = s.kind.format(s.Default)
	}
	return Var{Name: s.Name, Default: def, Type: s.kind.name, Service: s.Service, Doc: s.Doc, derived: s.defaultText != ""}
}

// envPrefix is a family of variables: every variable whose name starts with
// Name (CA_HEADER_X-Foo is the header X-Foo).
type envPrefix struct {
	Name, Type, Service, Doc string
}

func prefix(name, typ, service, doc string) *envPrefix {
	p := &envPrefix{Name: name, Type: typ, Service: service, Doc: doc}
	table = append(table, p)
	return p
}

func (p *envPrefix) row() Var {
	return Var{Name: p.Name, Default: "-", Type: p.Type, Service: p.Service, Doc: p.Doc, Prefix: true}
}

// Var is one row of help's table: the default as text.
type Var struct {
	Name, Default, Type, Service, Doc string
	// Prefix: every variable whose name starts with Name (ISTIO_META_*).
	Prefix bool
	// derived: Default says what the default is computed from.
	derived bool
}

// Reader reads an Environment through the table: each variable once (#26:
// PROV_CERT was read three times, and a bad value reported as many
// times). A second read of an entry, by another builder or a flag's
// alias (--redirect-dns falls back to ISTIO_META_DNS_CAPTURE, which the
// DNS proxy's config reads too), gets what the first found. A nil Reader
// is an empty environment.
type Reader struct {
	src Environment
	mu  sync.Mutex
	// read is what the one read of each variable found, by name: its
	// value, or nil when it was unset or bad.
	read map[string]any
}

// NewReader reads src.
func NewReader(src Environment) *Reader {
	return &Reader{src: src, read: map[string]any{}}
}

// MapEnvironment is a reader of an environment made of a map: tests, and
// the layers built on the process environment (the VM's cluster.env).
func MapEnvironment(m map[string]string) *Reader {
	return NewReader(Environment{
		Lookup: func(k string) (string, bool) { v, ok := m[k]; return v, ok },
		List: func() []string {
			out := make([]string, 0, len(m))
			for _, k := range slices.Sorted(maps.Keys(m)) {
				out = append(out, k+"="+m[k])
			}
			return out
		},
	})
}

// source is the environment under the reader, for a layer that derives
// another environment from it.
func (r *Reader) source() Environment {
	if r == nil {
		return Environment{}
	}
	return r.src
}

// read is the value of s's variable and whether it is set (and valid);
// the default when it is not. The first read of a bad value returns the
// error, naming the variable and the value; later reads take it as unset.
func read[T any](r *Reader, s *envVar[T]) (T, bool, error) {
	if r == nil {
		return s.Default, false, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if got, ok := r.read[s.Name]; ok {
		if v, set := got.(T); set {
			return v, true, nil
		}
		return s.Default, false, nil
	}
	text, ok := r.src.Get(s.Name)
	if !ok {
		r.read[s.Name] = nil
		return s.Default, false, nil
	}
	v, err := s.kind.parse(text)
	if err != nil {
		r.read[s.Name] = nil
		return s.Default, false, &valueError{Name: s.Name, Value: text, Err: err}
	}
	r.read[s.Name] = v
	return v, true, nil
}

// present says whether s's variable is set at all, even empty: GOGC,
// which Go's runtime reads so.
func present[T any](r *Reader, s *envVar[T]) bool {
	if r == nil || r.src.Lookup == nil {
		return false
	}
	_, ok := r.src.Lookup(s.Name)
	return ok
}

// prefixed returns every variable of the family p, keyed by the rest of
// the name (CA_HEADER_X-Foo=bar ⇒ "X-Foo": "bar").
func (r *Reader) prefixed(p *envPrefix) map[string]string {
	out := map[string]string{}
	for _, kv := range r.source().All() {
		k, v, ok := strings.Cut(kv, "=")
		if ok && len(k) > len(p.Name) && strings.HasPrefix(k, p.Name) {
			out[k[len(p.Name):]] = v
		}
	}
	return out
}

// valueError is a variable's bad value.
type valueError struct {
	Name, Value string
	Err         error
}

func (e *valueError) Error() string { return e.Name + "=" + quoteValue(e.Value) + ": " + e.Err.Error() }
func (e *valueError) Unwrap() error { return e.Err }

// Problems collects bad values, each naming where it came from (a flag, an
// environment variable, a file) and the value.
type Problems struct{ errs []error }

func (p *Problems) Add(err error) {
	if err != nil {
		p.errs = append(p.errs, err)
	}
}

func (p *Problems) addf(format string, args ...any) { p.Add(fmt.Errorf(format, args...)) }

// Err is every problem, joined; nil if there was none.
func (p *Problems) Err() error { return errors.Join(p.errs...) }

// envReader is how a builder reads: the environment, and where the bad
// values go.
type envReader struct {
	env      *Reader
	problems *Problems
}

// get is s's value: the variable's, else the table's default.
func get[T any](r envReader, s *envVar[T]) T {
	v, _ := lookup(r, s)
	return v
}

// optional is the variable's value, nil when it is unset: for a setting
// whose unset the service tells from any value (PEER_METADATA_DISCOVERY
// unset follows ISTIO_META_ENABLE_HBONE).
func optional[T any](r envReader, s *envVar[T]) *T {
	if v, ok := lookup(r, s); ok {
		return &v
	}
	return nil
}

// lookup is get, and whether the variable gave the value: for a setting
// whose unset differs from any value (CA_ADDR unset: the discovery
// address, and ISTIOD_SAN as the CA's name).
func lookup[T any](r envReader, s *envVar[T]) (T, bool) {
	v, set, err := read(r.env, s)
	r.problems.Add(err)
	return v, set
}
