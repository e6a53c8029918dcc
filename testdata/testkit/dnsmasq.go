package testkit

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// Dnsmasq runs a real dnsmasq, a resolver as a node has one, on port 53 of
// a random loopback address (resolv.conf cannot name a port): it answers
// *.upstream.test with 192.0.2.77, forwards nothing anywhere, and runs
// with extra flags added until the end of the test. It returns the
// address, or "" and why when it cannot run here (no dnsmasq, or not root:
// port 53); the caller skips or carries on without it.
func Dnsmasq(t testing.TB, extra ...string) (ip, why string) {
	t.Helper()
	bin, err := exec.LookPath("dnsmasq")
	if err != nil {
		return "", "dnsmasq not installed (apt-get install -y dnsmasq): no real upstream resolver"
	}
	if os.Geteuid() != 0 {
		return "", "not root: dnsmasq must bind port 53 of a loopback address"
	}
	for range 5 {
		ip := fmt.Sprintf("127.%d.%d.%d", 100+rand.IntN(100), 1+rand.IntN(250), 1+rand.IntN(250))
		args := append([]string{
			// -k, not --no-daemon: in debug mode dnsmasq answers TCP
			// inline and stops answering UDP while a TCP connection is
			// open; the proxy keeps idle TCP connections.
			"--keep-in-foreground", "--log-facility=-", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--port=53",
			"--listen-address=" + ip, "--bind-interfaces", "--pid-file=", "--user=root",
			"--address=/upstream.test/192.0.2.77",
		}, extra...)
		cmd := exec.Command(bin, args...)
		var stderr LogBuffer
		cmd.Stderr = &stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its TCP children die with it
		if err := cmd.Start(); err != nil {
			t.Fatalf("start dnsmasq: %v", err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		stop := func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-exited }
		if answers(ip+":53", exited) {
			t.Cleanup(stop)
			return ip, ""
		}
		stop()
		t.Logf("dnsmasq on %s did not come up: %s", ip, stderr.String())
	}
	t.Fatal("dnsmasq did not start")
	return "", ""
}

// answers asks addr for probe.upstream.test for a few seconds, until it
// answers or exited is closed.
func answers(addr string, exited <-chan struct{}) bool {
	c := &dns.Client{Timeout: 200 * time.Millisecond}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return false
		default:
		}
		m := new(dns.Msg).SetQuestion("probe.upstream.test.", dns.TypeA)
		if r, _, err := c.Exchange(m, addr); err == nil && len(r.Answer) == 1 {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}
