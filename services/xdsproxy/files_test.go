package xdsproxy

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// A token path that holds a FIFO is a warning naming it, and the stream
// is dialled without the token, as with no file (issue #21: os.ReadFile
// blocked the dial for ever).
func TestTokenFileNotRegular(t *testing.T) {
	cp := servingControlPlane(t, "v1", 3)
	cfg := testConfig(tempRoot(t), cp.Addr())
	if err := os.MkdirAll(filepath.Dir(cfg.TokenFile), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(cfg.TokenFile, 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, cfg, proxyOpts{})
	c := p.client(t, false)
	if err := c.WaitFor(waitCtx(t), bothTypes("v1", 3)); err != nil {
		t.Fatal(err)
	}
	testkit.Contains(t, "logs", p.logs.String(), "cannot read the token", cfg.TokenFile, "not a regular file (a FIFO)")
}
