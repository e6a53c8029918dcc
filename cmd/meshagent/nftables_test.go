package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"

	"github.com/meshagent/meshagent/services/capture"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// TestIstioIptablesNftDryRun: --native-nftables (or NATIVE_NFTABLES, as
// Istio names it) with --dry-run prints Istio's nft transaction and nothing
// else, so that its output can be piped to nft -f (#23).
func TestIstioIptablesNftDryRun(t *testing.T) {
	args := append([]string{}, sidecarArgs...)
	code, byFlag, errOut := runIptables(t, nil, "ipv6", nil, append(args, "--native-nftables")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.HasPrefix(byFlag, "add table inet istio-proxy-nat\nflush table inet istio-proxy-nat\n") {
		t.Errorf("dry run does not start with Istio's nat table:\n%s", byFlag)
	}
	testkit.Contains(t, "nft dry run", byFlag,
		"add rule inet istio-proxy-nat istio-inbound meta l4proto tcp tcp dport 15090 counter return",
		"add rule inet istio-proxy-nat istio-output oifname lo ip6 saddr ::6/128 counter return",
		"add rule inet istio-proxy-nat istio-output counter jump istio-redirect",
	)
	if strings.Contains(byFlag, "iptables") || strings.Contains(byFlag, "ISTIO_") {
		t.Errorf("nft dry run mentions iptables:\n%s", byFlag)
	}
	code, byEnv, errOut := runIptables(t, map[string]string{"NATIVE_NFTABLES": "true"}, "ipv6", nil, args...)
	if code != 0 || byEnv != byFlag {
		t.Errorf("NATIVE_NFTABLES=true: exit %d, output differs from --native-nftables:\n%s%s", code, testkit.LineDiff(byFlag, byEnv), errOut)
	}
	code, clean, _ := runIptables(t, nil, "ipv4", nil, "istio-iptables", "--native-nftables", "--cleanup-only", "--dry-run")
	if want := capture.NftRemovalText(); code != 0 || clean != want {
		t.Errorf("--cleanup-only --dry-run: exit %d, printed\n%s\nwant\n%s", code, clean, want)
	}
	code, clean, _ = runIptables(t, nil, "ipv4", nil, "clean-iptables", "--native-nftables", "--dry-run")
	if want := capture.NftRemovalText(); code != 0 || clean != want {
		t.Errorf("clean-iptables --dry-run: exit %d, printed\n%s\nwant\n%s", code, clean, want)
	}
	code, _, errOut = runIptables(t, nil, "ipv4", nil, "istio-iptables", "--native-nftables", "--force-iptables-binary", "nft", "--dry-run")
	if code != 2 || !strings.Contains(errOut, "--force-iptables-binary") {
		t.Errorf("--native-nftables with --force-iptables-binary: exit %d, %q; want 2 naming the conflict", code, errOut)
	}
}

// TestIstioIptablesNftApplyInNetns: the real command in a fresh namespace
// programs the nftables capture (the capture package's tests cover re-runs,
// cleanup and traffic).
func TestIstioIptablesNftApplyInNetns(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed (Debian package nftables)")
	}
	args := append([]string{}, sidecarArgs[:len(sidecarArgs)-1]...) // without --dry-run
	code, out := runChild(t, false, nil, append(args, "--native-nftables")...)
	if code != 0 || !strings.Contains(out, "outcome=applied") || !strings.Contains(out, "backend=nftables") {
		t.Errorf("apply: exit %d: %s", code, out)
	}
}

// TestIstioIptablesNftConformanceAgainstIstio runs Istio's own agent
// (pilot-agent istio-iptables --native-nftables) beside ours on the same
// flags, for what Istio's 28 goldens do not cover: CLI parsing, env, the
// host's address family and resolv.conf. Istio's nft backend ignores
// --dry-run and applies, so its run gets a network namespace of its own; the
// transaction it logs ("nftables rules programmed:") must equal our dry run.
func TestIstioIptablesNftConformanceAgainstIstio(t *testing.T) {
	testkit.RequireRoot(t, "Istio's agent applies nft rules even with --dry-run", "unshare", "ip", "nft")
	agent, err := e2ekit.IstioAgentBinary()
	if err != nil {
		t.Skip(err)
	}
	// Istio reads the fixed path /etc/resolv.conf: its run gets the test's
	// own file bound over it (a mount namespace of its own), and ours the
	// same servers. Nothing is resolved: the servers only shape the rules.
	nameservers := []string{"127.0.0.53", "fd00::53"}
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 127.0.0.53\nnameserver fd00::53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"-p", "15001", "-z", "15006", "-u", "1337"}
	for _, tc := range []struct {
		name   string
		family string
		env    map[string]string
		args   []string
	}{
		{"sidecar", "ipv4", nil, []string{"-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020"}},
		{"sidecar-ipv6", "ipv6", nil, []string{"-m", "REDIRECT", "-i", "*", "-b", "*", "-d", "15090,15021,15020"}},
		{"tproxy", "ipv4", nil, []string{"-m", "TPROXY", "-b", "*", "-i", "10.0.0.0/8", "-x", "10.1.0.0/16", "-c", "eth9"}},
		{"tproxy-ipv6", "ipv6", nil, []string{"-m", "TPROXY", "-b", "8080,9090", "-i", "10.0.0.0/8,fd00::/8", "-x", "fd00:1::/32"}},
		{"ports", "ipv4", nil, []string{"-b", "8080", "-q", "80,443", "-o", "3306,5432", "-k", "eth1", "-i", "*", "--drop-invalid"}},
		{"dns", "ipv4", nil, []string{"-b", "*", "-i", "*", "--redirect-dns"}},
		{"dns-all-ipv6", "ipv6", map[string]string{"ISTIO_META_DNS_CAPTURE": "true"}, []string{"-b", "*", "-i", "*", "--capture-all-dns"}},
		{"owner-groups", "ipv4", map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE": "0"}, []string{"-b", "*", "-i", "*"}},
		{"uids-gids", "ipv4", nil, []string{"-u", "1337,1338", "-g", "1339", "-b", "*", "-i", "*", "--redirect-dns"}},
		{"cleanup-only", "ipv4", nil, []string{"-m", "TPROXY", "-b", "*", "-i", "*", "--cleanup-only"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append(append([]string{}, base...), tc.args...), "--native-nftables", "--dry-run")
			code, ours, errOut := runIptables(t, tc.env, tc.family, nameservers, append([]string{"istio-iptables"}, args...)...)
			if code != 0 {
				t.Fatalf("ours: exit %d: %s", code, errOut)
			}
			addr := "240.240.240.240/32"
			if tc.family == "ipv6" {
				addr = "2001:db8::10/128"
			}
			script := `mount --bind "$1" /etc/resolv.conf && shift && ip link set lo up && ip addr add "$1" dev lo && shift && exec "$@"`
			cmd := exec.Command("unshare", append([]string{"-m", "-n", "sh", "-c", script, "sh", resolv, addr, agent, "istio-iptables"}, args...)...)
			cmd.Env = os.Environ()
			for k, v := range tc.env {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("Istio's agent: %v\n%s", err, out)
			}
			_, istio, ok := strings.Cut(string(out), "nftables rules programmed:\n")
			if !ok {
				t.Fatalf("Istio's agent logged no transaction:\n%s", out)
			}
			if got, want := strings.TrimSpace(ours), strings.TrimSpace(istio); got != want {
				t.Errorf("our dry run differs from Istio's transaction\n%s", testkit.LineDiff(want, got))
			}
		})
	}
}

// TestIstioIptablesBackendNeverFlipFlops: on a node the init step programmed
// with nftables, ten more runs with neither flag (a restart, a re-run) stay
// on nftables and leave the one set unchanged; asking for iptables there is
// an error naming both; clean-iptables with neither flag removes the tables,
// after which the default is iptables again (#23; istio#61020).
func TestIstioIptablesBackendNeverFlipFlops(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed (Debian package nftables)")
	}
	apply := append([]string{}, sidecarArgs[:len(sidecarArgs)-1]...) // without --dry-run
	cmds := [][]string{append(append([]string{}, apply...), "--native-nftables")}
	for range 10 {
		cmds = append(cmds, apply)
	}
	cmds = append(cmds,
		append(append([]string{}, apply...), "--force-iptables-binary", "nft"),
		[]string{"clean-iptables"},
		apply,
	)
	codes, outs := runChildSeq(t, cmds...)
	if codes[0] != 0 || !strings.Contains(outs[0], "outcome=applied") || !strings.Contains(outs[0], "backend=nftables") {
		t.Fatalf("first run (--native-nftables): exit %d: %s", codes[0], outs[0])
	}
	for i := 1; i <= 10; i++ {
		if codes[i] != 0 || !strings.Contains(outs[i], "outcome=unchanged") || !strings.Contains(outs[i], "backend=nftables") {
			t.Errorf("re-run %d with neither flag: exit %d: %s", i, codes[i], outs[i])
		}
	}
	if c, o := codes[11], outs[11]; c != 1 || !strings.Contains(o, "--force-iptables-binary") || !strings.Contains(o, "inet istio-proxy-") {
		t.Errorf("iptables asked for beside our nft tables: exit %d: %s; want 1 naming both", c, o)
	}
	if codes[12] != 0 {
		t.Errorf("clean-iptables: exit %d: %s", codes[12], outs[12])
	}
	if c, o := codes[13], outs[13]; c != 0 || !strings.Contains(o, "outcome=applied") || !strings.Contains(o, "backend=iptables") {
		t.Errorf("after clean-iptables, neither flag: exit %d: %s; want iptables, applied", c, o)
	}
}
