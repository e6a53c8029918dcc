package config

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The mesh config file and cluster.env are read only when they are regular
// files (issue 21): a FIFO neither hangs the start nor a device feeds it
// without end; the error names the file.
func TestConfigFilesMustBeRegular(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "mesh-fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{fifo, "/dev/zero"} {
		_, err := loadProxyConfig(proxyConfigSources{meshConfigFile: path}, quietLog())
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("mesh config %s: %v; want an error naming it as not a regular file", path, err)
		}
		if _, err := readEnvFile(path); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("cluster.env %s: %v; want not a regular file", path, err)
		}
	}
}
