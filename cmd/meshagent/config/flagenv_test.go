package config

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/meshagent/meshagent/testdata/testkit"
)

type testSettings struct {
	port     int
	wait     time.Duration
	on       bool
	optional *int
	name     string
}

func bindTestSettings(fs *pflag.FlagSet) (*Settings, *testSettings) {
	s, v := NewSettings(fs), &testSettings{}
	// Entries of no table: the package's table holds the agent's own.
	envFlagVar(s, &v.port, flagSpec{name: "port", usage: "a port"}, &envVar[int]{Name: "PORT", Default: 15000, kind: asPort})
	envFlagVar(s, &v.wait, flagSpec{name: "wait", usage: "a wait"},
		&envVar[time.Duration]{Name: "WAIT", Default: 5 * time.Second, kind: asDuration}, &envVar[time.Duration]{Name: "OLD_WAIT", kind: asDuration})
	envFlagVar(s, &v.on, flagSpec{name: "on", short: "o", usage: "a switch"}, &envVar[bool]{Name: "ON", kind: asBool})
	optionalFlagVar(s, &v.optional, parseCount, flagSpec{name: "optional", usage: "maybe a count"}, &envVar[int]{Name: "OPTIONAL", kind: asCount})
	flagVar(s, &v.name, "x", parseString, flagSpec{name: "name", usage: "no variable"})
	return s, v
}

// The command line wins, then the first variable set, then the default.
func TestFlagElseEnvElseDefault(t *testing.T) {
	for _, tc := range []struct {
		name string
		Args []string
		Env  map[string]string
		want testSettings
	}{
		{"defaults", nil, nil, testSettings{port: 15000, wait: 5 * time.Second, name: "x"}},
		{"environment", nil, map[string]string{"PORT": "25000", "OLD_WAIT": "1s", "ON": "true", "OPTIONAL": "0"},
			testSettings{port: 25000, wait: time.Second, on: true, optional: new(int), name: "x"}},
		{"first variable wins", nil, map[string]string{"WAIT": "2s", "OLD_WAIT": "1s"}, testSettings{port: 15000, wait: 2 * time.Second, name: "x"}},
		{"empty is unset", nil, map[string]string{"PORT": ""}, testSettings{port: 15000, wait: 5 * time.Second, name: "x"}},
		{"flags win", []string{"--port", "35000", "-o=false", "--wait", "3s", "--optional", "7"}, map[string]string{"PORT": "25000", "ON": "true", "WAIT": "1s", "OPTIONAL": "2"},
			testSettings{port: 35000, wait: 3 * time.Second, optional: intPtr(7), name: "x"}},
		{"bool flag alone", []string{"--on"}, nil, testSettings{port: 15000, wait: 5 * time.Second, on: true, name: "x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
			s, got := bindTestSettings(fs)
			if err := fs.Parse(tc.Args); err != nil {
				t.Fatal(err)
			}
			if err := s.Resolve(MapEnvironment(tc.Env)); err != nil {
				t.Fatal(err)
			}
			if got.port != tc.want.port || got.wait != tc.want.wait || got.on != tc.want.on || got.name != tc.want.name ||
				(got.optional == nil) != (tc.want.optional == nil) || (got.optional != nil && *got.optional != *tc.want.optional) {
				t.Errorf("got %+v (optional %v), want %+v (optional %v)", *got, deref(got.optional), tc.want, deref(tc.want.optional))
			}
		})
	}
}

// Bad values of flags and variables are all reported, each naming itself
// and the value; a good flag is not spoiled by a bad variable.
func TestBadSettingsAreReportedTogether(t *testing.T) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	s, got := bindTestSettings(fs)
	if err := fs.Parse([]string{"--port", "0", "--optional", "-3"}); err != nil {
		t.Fatalf("a bad value stopped the parse: %v", err)
	}
	err := s.Resolve(MapEnvironment(map[string]string{"PORT": "x", "WAIT": "soon", "ON": "perhaps"}))
	if err == nil {
		t.Fatal("no error")
	}
	testkit.Contains(t, "the error", err.Error(), `--port "0"`, `--optional "-3"`, `WAIT="soon"`, `ON="perhaps"`)
	if strings.Contains(err.Error(), `PORT="x"`) {
		t.Errorf("PORT was read although --port was given: %v", err)
	}
	if got.wait != 5*time.Second || got.on {
		t.Errorf("bad variables changed the values: %+v", *got)
	}
}

// --help names every flag's variables, as consul-dataplane's flags do.
func TestHelpNamesTheVariables(t *testing.T) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	bindTestSettings(fs)
	var out bytes.Buffer
	fs.SetOutput(&out)
	fs.PrintDefaults()
	testkit.Contains(t, "--help", out.String(), "(env PORT)", "(env WAIT, OLD_WAIT)", "-o, --on", "(default 15000)")
}

// A builder's read: the variable's value, else the entry's default; an
// empty value is unset; a bad one is reported once, naming the variable and
// the value, however many read it.
func TestGet(t *testing.T) {
	p := &Problems{}
	r := envReader{env: MapEnvironment(map[string]string{"N": "3", "BAD": "x", "EMPTY": ""}), problems: p}
	entry := func(name string) *envVar[int] { return &envVar[int]{Name: name, Default: 1, kind: asCount} }
	if got := get(r, entry("N")); got != 3 {
		t.Errorf("N = %d", got)
	}
	if got, set := lookup(r, entry("EMPTY")); got != 1 || set {
		t.Errorf("EMPTY = %d, %v; want the default, unset", got, set)
	}
	if got := optional(r, entry("UNSET")); got != nil {
		t.Errorf("UNSET = %v, want nil", *got)
	}
	bad := entry("BAD")
	if got := get(r, bad); got != 1 || p.Err() == nil || p.Err().Error() != `BAD="x": want a whole number, 0 or more` {
		t.Errorf("BAD = %d, problems %v", got, p.Err())
	}
	var ve *valueError
	if !errors.As(p.Err(), &ve) {
		t.Errorf("BAD: %T, want a *ValueError", p.Err())
	}
	if got := get(r, bad); got != 1 || strings.Count(p.Err().Error(), "BAD=") != 1 {
		t.Errorf("BAD read again = %d, problems %v; want the default, reported once", got, p.Err())
	}
	if got := get(envReader{problems: p}, entry("N")); got != 1 {
		t.Errorf("a nil reader gave %d, want the default", got)
	}
}

func intPtr(n int) *int { return &n }

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}
