// Command controlplane serves a small mesh over plaintext ADS
// (go-control-plane, the test kit's xdsserver) until it is signalled: the
// control plane the agents of bench/agent/rss.sh and bench/vs-istio/run.sh
// connect to, so that their Envoys receive configuration and both agents
// turn ready, as in a pod.
//
// With -names N it also serves an NDS name table of N Kubernetes services
// (svcI.nsJ.svc.cluster.local, as bench/lib.sh's mesh_table names them),
// the same table to every agent, so that Istio's agent and ours answer the
// same names (#24). Each line "swap" on stdin replaces the table with one
// whose every address changed; with -probe ADDR the control plane then asks
// ADDR for the last name until the new address comes back and prints
// "swap-ms MS" (from the table handed to the server to the first answer
// that has it): the time an agent takes to swap a new table in.
//
// For hack/attack (#33), two more stdin lines: "push MIB" replaces the
// clusters with ones that make a single CDS response of about MIB MiB, and
// "names N" replaces the name table with one of N services; each answers
// "pushed" once the snapshot is set.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/miekg/dns"

	"github.com/meshagent/meshagent/messages/nds"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "where to listen")
	ns := flag.String("namespace", "ns0", "the services' namespace")
	names := flag.Int("names", 0, "serve an NDS name table of this many services (0: none)")
	probe := flag.String("probe", "", "host:port of the DNS proxy to time a swap against")
	flag.Parse()
	var table *nds.NameTable
	if *names > 0 {
		table = meshTable(*names, 1)
	}
	cp, err := xdsserver.StartSmallMesh(xdsserver.Options{Addr: *addr}, *ns, table)
	if err != nil {
		fail(err)
	}
	defer cp.Close()
	fmt.Println(cp.Addr())
	go swaps(cp, *names, *probe, *ns)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "controlplane:", err)
	os.Exit(1)
}

// meshTable is n services over 10 namespaces, generation gen: service i at
// 10.0.0.0 + gen<<20 + i + 1, so that each generation changes every address.
func meshTable(n, gen int) *nds.NameTable {
	t := &nds.NameTable{Table: make(map[string]*nds.NameTable_NameInfo, n)}
	for i := 0; i < n; i++ {
		t.Table[meshName(i)] = &nds.NameTable_NameInfo{
			Ips: []string{meshIP(i, gen).String()}, Registry: "Kubernetes",
			Shortname: fmt.Sprintf("svc%d", i), Namespace: fmt.Sprintf("ns%d", i%10),
		}
	}
	return t
}

func meshName(i int) string { return fmt.Sprintf("svc%d.ns%d.svc.cluster.local", i, i%10) }

func meshIP(i, gen int) netip.Addr {
	v := uint32(10)<<24 | uint32(gen)<<20 | uint32(i+1)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// padded are clusters whose CDS response is about mib MiB: 4 KiB of
// alt_stat_name each (one string shared by all, so the control plane holds
// it once and only the response is large).
func padded(mib int) []types.Resource {
	const each = 4 << 10
	pad := strings.Repeat("p", each)
	cs := xdsserver.Clusters(mib<<20/each, "attack")
	for _, c := range cs {
		c.(*clusterv3.Cluster).AltStatName = pad
	}
	return cs
}

// swaps replaces the table on every "swap" line of stdin and, with a probe
// address, times how long the agent there takes to answer from it.
func swaps(cp *xdsserver.Server, n int, probe, ns string) {
	gen := 1
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var arg int
		if _, err := fmt.Sscanf(in.Text(), "push %d", &arg); err == nil {
			gen++
			c, l, r, e := xdsserver.SmallMesh(fmt.Sprintf("v%d", gen), ns)
			if err := cp.SetSnapshot(fmt.Sprintf("v%d", gen), append(c, padded(arg)...), l, r, e, nil); err != nil {
				fail(err)
			}
			fmt.Println("pushed")
			continue
		}
		if _, err := fmt.Sscanf(in.Text(), "names %d", &arg); err == nil {
			if err := cp.SetNameTable(meshTable(arg, gen)); err != nil {
				fail(err)
			}
			fmt.Println("pushed")
			continue
		}
		if strings.TrimSpace(in.Text()) != "swap" || n == 0 {
			continue
		}
		gen++
		t := meshTable(n, gen) // built before the clock starts: istiod's work, not the agent's
		start := time.Now()
		if err := cp.SetNameTable(t); err != nil {
			fail(err)
		}
		if probe == "" {
			fmt.Println("swapped")
			continue
		}
		if d, ok := await(probe, meshName(n-1), meshIP(n-1, gen), start); ok {
			fmt.Printf("swap-ms %.1f\n", float64(d.Microseconds())/1000)
		} else {
			fmt.Println("swap-ms timeout")
		}
	}
}

// await asks server for name every half millisecond, bounded (60 s), until
// the answer holds want; the time since start when it did.
func await(server, name string, want netip.Addr, start time.Time) (time.Duration, bool) {
	c := &dns.Client{Timeout: 100 * time.Millisecond}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	for time.Since(start) < time.Minute {
		if r, _, err := c.Exchange(q, server); err == nil {
			for _, rr := range r.Answer {
				if a, ok := rr.(*dns.A); ok && a.A.Equal(want.AsSlice()) {
					return time.Since(start), true
				}
			}
		}
		time.Sleep(500 * time.Microsecond)
	}
	return 0, false
}
