package bootstrap

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestLaterStartsWriteTheFirstRender: the first start renders; a later one
// (Rewrite) writes the same bytes again, even with the file gone and the
// inputs changed since (Istio renders once per agent start too).
func TestLaterStartsWriteTheFirstRender(t *testing.T) {
	c := testConfig(t)
	labels := filepath.Join(t.TempDir(), "labels")
	if err := os.WriteFile(labels, []byte("app=\"reviews\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.LabelsFile = labels
	first, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(first.data, []byte(`"reviews"`)) {
		t.Fatalf("first render lacks the labels:\n%s", first.data)
	}
	if err := os.WriteFile(labels, []byte("app=\"changed\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(first.Path); err != nil {
		t.Fatal(err)
	}
	if err := first.Rewrite(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(first.Path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, first.data) {
		t.Fatalf("a later start wrote\n%s\nwant the first render\n%s", got, first.data)
	}
}

// TestCustomConfigFileIsNeverWritten: a custom config file is Envoy's as
// is, on every start.
func TestCustomConfigFileIsNeverWritten(t *testing.T) {
	c := testConfig(t)
	custom := filepath.Join(t.TempDir(), "custom.json")
	if err := os.WriteFile(custom, []byte(`{"admin": {}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Proxy.CustomConfigFile = custom
	first, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	if !first.Custom || first.Path != custom || first.data != nil || first.SHA256() != "" {
		t.Fatalf("custom config file rendered as %+v", first)
	}
	if err := os.WriteFile(custom, []byte(`{"admin": {"address": {}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := first.Rewrite(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(custom); string(got) != `{"admin": {"address": {}}}` {
		t.Fatalf("a later start rewrote the custom config file: %s", got)
	}
}
