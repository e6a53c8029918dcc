package config

import (
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
)

// Environment is the process environment as the configuration sees it: a
// lookup, and the whole list for prefixed variables (ISTIO_META_*,
// CA_HEADER_*). Production has one, Process; tests make theirs with
// FromMap. Nothing reads it but a Reader (and layers that build a derived
// environment from it: the VM's cluster.env, standalone's defaults).
type Environment struct {
	Lookup func(name string) (string, bool)
	List   func() []string
}

// Process is the agent's own environment: the one place the process
// environment is read (#26).
func Process() Environment { return Environment{Lookup: os.LookupEnv, List: os.Environ} }

// FromMap is an environment made of a map: tests, and the layers built on
// another environment.
func FromMap(m map[string]string) Environment {
	return Environment{
		Lookup: func(k string) (string, bool) { v, ok := m[k]; return v, ok },
		List: func() []string {
			out := make([]string, 0, len(m))
			for _, k := range slices.Sorted(maps.Keys(m)) {
				out = append(out, k+"="+m[k])
			}
			return out
		},
	}
}

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

// Reader is how the configuration reads an Environment: by the names of
// the table (Env), each counted, so that a test can check that one start
// reads each variable once (#26: PROV_CERT was read three times, and a bad
// value reported as many times). A nil Reader is an empty environment.
type Reader struct {
	src   Environment
	mu    sync.Mutex
	reads map[string]int
	// bad are the variables whose bad value Value has reported.
	bad map[string]bool
}

// NewReader reads src.
func NewReader(src Environment) *Reader {
	return &Reader{src: src, reads: map[string]int{}, bad: map[string]bool{}}
}

// Source is the environment under the reader, for a layer that derives
// another environment from it (reading through it would count its reads).
func (r *Reader) Source() Environment {
	if r == nil {
		return Environment{}
	}
	return r.src
}

func (r *Reader) count(name string) {
	r.mu.Lock()
	r.reads[name]++
	r.mu.Unlock()
}

// Text is the variable's text and whether it is set and not empty.
func (r *Reader) Text(name string) (string, bool) {
	if r == nil {
		return "", false
	}
	r.count(name)
	return r.src.Get(name)
}

// Lookup is the variable as the process has it: set even when empty. Only
// for a variable whose reader outside the agent tells empty from unset
// (GOGC: Go's runtime); the configuration's own use Text.
func (r *Reader) Lookup(name string) (string, bool) {
	if r == nil || r.src.Lookup == nil {
		return "", false
	}
	r.count(name)
	return r.src.Lookup(name)
}

// reportedBad says whether name's bad value was reported already, and
// marks it reported.
func (r *Reader) reportedBad(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := r.bad[name]
	r.bad[name] = true
	return seen
}

// Prefixed returns every variable whose name starts with prefix, keyed by
// the rest of the name (CA_HEADER_X-Foo=bar ⇒ "X-Foo": "bar"). It counts
// as a read of the prefix entry (prefix + "*").
func (r *Reader) Prefixed(prefix string) map[string]string {
	out := map[string]string{}
	if r == nil {
		return out
	}
	r.count(prefix + "*")
	for _, kv := range r.src.All() {
		k, v, ok := strings.Cut(kv, "=")
		if ok && len(k) > len(prefix) && strings.HasPrefix(k, prefix) {
			out[k[len(prefix):]] = v
		}
	}
	return out
}

// All is the whole environment, as NAME=value lines: what Envoy inherits
// and turns into node metadata (ISTIO_META_*, ISTIO_METAJSON_*). It counts
// as a read of AllVariables.
func (r *Reader) All() []string {
	if r == nil {
		return nil
	}
	r.count(AllVariables)
	return r.src.All()
}

// AllVariables is the name All's reads are counted under.
const AllVariables = "*"

// Reads is how many times each name was read (prefixes as PREFIX*, the
// whole environment as AllVariables).
func (r *Reader) Reads() map[string]int {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.reads)
}

// Value reads the variable name with parse: its value and true when it is
// set and valid; false when it is unset; an error naming the variable and
// the value (quoted, cut when long) when it is not valid. A bad value is
// reported once: a second reader of the variable (istio-iptables' aliases
// ISTIO_DUAL_STACK and ISTIO_META_DNS_CAPTURE) gets it as unset, so that one
// typo is one line of the start's errors.
func Value[T any](r *Reader, name string, parse Parser[T]) (T, bool, error) {
	var zero T
	text, ok := r.Text(name)
	if !ok {
		return zero, false, nil
	}
	v, err := parse(text)
	if err != nil {
		if r.reportedBad(name) {
			return zero, false, nil
		}
		return zero, false, &ValueError{Name: name, Value: text, Err: err}
	}
	return v, true, nil
}

// ValueError is a variable's bad value.
type ValueError struct {
	Name, Value string
	Err         error
}

func (e *ValueError) Error() string { return e.Name + "=" + QuoteValue(e.Value) + ": " + e.Err.Error() }
func (e *ValueError) Unwrap() error { return e.Err }
