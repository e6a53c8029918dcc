package config

import (
	"errors"
	"strings"
	"testing"
)

// Each entry is complete and named once: `help env` and the docs are made
// from it.
func TestEnvTableComplete(t *testing.T) {
	seen := map[string]bool{}
	for _, v := range Env {
		if seen[v.Name] {
			t.Errorf("%s: twice in the table", v.Name)
		}
		seen[v.Name] = true
		if v.Type == "" || v.Service == "" || v.Doc == "" {
			t.Errorf("%s: type %q, service %q, doc %q: each is required", v.Name, v.Type, v.Service, v.Doc)
		}
		if v.Prefix != strings.HasSuffix(v.Name, "_") {
			t.Errorf("%s: a prefix entry, and only one, ends with _", v.Name)
		}
	}
}

func TestFind(t *testing.T) {
	for name, want := range map[string]string{
		"PROV_CERT":              "PROV_CERT",
		"ISTIO_META_DNS_CAPTURE": "ISTIO_META_DNS_CAPTURE", // its own entry, not the prefix's
		"ISTIO_META_FOO":         "ISTIO_META_",
		"ISTIO_METAJSON_LABELS":  "ISTIO_METAJSON_",
		"CA_HEADER_*":            "CA_HEADER_",
		AllVariables:             AllVariables,
	} {
		if v, ok := Find(name); !ok || v.Name != want {
			t.Errorf("Find(%s) = %s, %v; want %s", name, v.Name, ok, want)
		}
	}
	if v, ok := Find("NOT_A_VARIABLE"); ok {
		t.Errorf("Find(NOT_A_VARIABLE) = %s", v.Name)
	}
}

// The reader counts every read, takes an empty value as unset, and names
// the variable and the value of a bad one.
func TestReader(t *testing.T) {
	r := NewReader(FromMap(map[string]string{"N": "3", "BAD": "x", "EMPTY": "", "CA_HEADER_A": "1"}))
	if v, ok, err := Value(r, "N", ParseCount); v != 3 || !ok || err != nil {
		t.Errorf("N = %d, %v, %v", v, ok, err)
	}
	if _, ok, err := Value(r, "EMPTY", ParseCount); ok || err != nil {
		t.Errorf("EMPTY: set %v, %v; want unset", ok, err)
	}
	_, ok, err := Value(r, "BAD", ParseCount)
	var bad *ValueError
	if ok || !errors.As(err, &bad) || err.Error() != `BAD="x": want a whole number, 0 or more` {
		t.Errorf("BAD: %v, %v", ok, err)
	}
	if _, ok, err := Value(r, "BAD", ParseBool); ok || err != nil {
		t.Errorf("BAD read again: %v, %v; want it unset, reported once", ok, err)
	}
	if v, ok := r.Lookup("EMPTY"); !ok || v != "" {
		t.Errorf("Lookup(EMPTY) = %q, %v; want set and empty", v, ok)
	}
	if h := r.Prefixed("CA_HEADER_"); h["A"] != "1" || len(h) != 1 {
		t.Errorf("Prefixed(CA_HEADER_) = %v", h)
	}
	r.Text("N")
	reads := r.Reads()
	for name, want := range map[string]int{"N": 2, "EMPTY": 2, "BAD": 2, "CA_HEADER_*": 1} {
		if reads[name] != want {
			t.Errorf("%s read %d times, want %d (%v)", name, reads[name], want, reads)
		}
	}
	var none *Reader
	if _, ok := none.Text("N"); ok {
		t.Error("a nil reader has a variable")
	}
}
