package xdsproxy

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// A cache file the agent cannot trust, or should not read, is ignored with
// a warning naming the file and why (its mode and owner when another user
// could have written it), never served and never removed, and the agent
// starts without it (issue #21: a FIFO hung the service at start, a 1 GiB
// file cost 1 GB before its rejection, and a world-writable or
// other-owner file was served without a word).
func TestUntrustedCacheFileIgnored(t *testing.T) {
	cfg, good := stoppedCacheOfV1(t)
	cases := []struct {
		name    string
		prepare func(t *testing.T, path string)
		max     int64 // CacheMaxBytes, when not the default
		want    []string
		removed bool
	}{
		{"FIFO", func(t *testing.T, path string) {
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
		}, 0, []string{"not a regular file (a FIFO)"}, false},
		{"world-writable", func(t *testing.T, path string) {
			write(t, path, good, 0o666)
		}, 0, []string{"could have been written by another user", "mode -rw-rw-rw-", "owner uid " + strconv.Itoa(os.Geteuid())}, false},
		{"group-writable", func(t *testing.T, path string) {
			write(t, path, good, 0o620)
		}, 0, []string{"could have been written by another user", "mode -rw--w----"}, false},
		{"another owner", func(t *testing.T, path string) {
			if os.Geteuid() != 0 {
				t.Skip("chowning the file to another user needs root")
			}
			write(t, path, good, 0o600)
			if err := os.Chown(path, 1337, 1337); err != nil {
				t.Fatal(err)
			}
		}, 0, []string{"could have been written by another user", "owner uid 1337 gid 1337"}, false},
		// Over the bound: refused before it is read (it is the agent's
		// own, so it is removed as any unusable cache file is).
		{"too large", func(t *testing.T, path string) {
			write(t, path, append(good, bytes.Repeat([]byte{0}, 1<<20)...), 0o600)
		}, int64(len(good)) + 1000, []string{"file too large", "more than " + strconv.Itoa(len(good)+1000)}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(cfg.CacheFile)
			tc.prepare(t, cfg.CacheFile)
			c := cfg
			if tc.max != 0 {
				c.CacheMaxBytes = tc.max
			}
			p := startProxy(t, c, proxyOpts{})
			testkit.Contains(t, "logs", p.logs.String(), append([]string{"ignoring the xDS cache file", cfg.CacheFile}, tc.want...)...)
			_, err := os.Lstat(cfg.CacheFile)
			if gone := os.IsNotExist(err); gone != tc.removed {
				t.Errorf("cache file removed = %v, want %v (%v)", gone, tc.removed, err)
			}
			p.wantNothingServed(t)
		})
	}
}

// write writes data to path with exactly mode (no umask).
func write(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// The DNS name table is kept with the last-known-good configuration: an
// agent restarted while the control plane is down publishes it at once,
// so that DNS turns ready, and serves Envoy from the cache (issue #21:
// readiness stayed 503 on "dns: starting" for the whole outage).
func TestNameTableCachedForOutage(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		cp, cfg := namesControlPlane(t, "10.0.0.7")
		p := startProxy(t, cfg, proxyOpts{})
		// As recordV1, but the client stays until the table has come too.
		c := p.client(t, delta)
		ctx := waitCtx(t)
		if err := c.WaitFor(ctx, bothTypes("v1", 3)); err != nil {
			t.Fatal(err)
		}
		if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool {
			return s.ACKs[resource.ClusterType] > 0 && s.ACKs[resource.ListenerType] > 0
		}); err != nil {
			t.Fatal(err)
		}
		live := p.names.WaitFor(t, "the control plane's table", func(v []messages.NameTable) bool { return len(v) == 1 })
		c.Close()
		// Stopping writes the cache once the streams have ended.
		p.stop(t)

		cp.Stop()
		p2 := startProxy(t, cfg, proxyOpts{})
		got := p2.names.WaitFor(t, "the cached table", func(v []messages.NameTable) bool { return len(v) == 1 })
		if got[0].Version != live[0].Version {
			t.Errorf("cached table version %q, want %q", got[0].Version, live[0].Version)
		}
		if ips := got[0].Hosts["reviews.default.svc.cluster.local"].IPs; len(ips) != 1 || ips[0].String() != "10.0.0.7" {
			t.Errorf("cached table maps reviews to %v, want 10.0.0.7", ips)
		}
		testkit.Contains(t, "logs", p2.logs.String(), "published the cached DNS name table")
		servedFromCache(t, p2, delta)
	})
}
