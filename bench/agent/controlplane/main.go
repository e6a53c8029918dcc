// Command controlplane serves a small mesh over plaintext ADS
// (go-control-plane, the test kit's xdsserver) until it is signalled: the
// control plane both agents of bench/agent/rss.sh connect to, so that
// their Envoys receive configuration and both agents turn ready, as in a
// pod.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "where to listen")
	ns := flag.String("namespace", "ns0", "the services' namespace")
	flag.Parse()
	cp, err := xdsserver.Start(xdsserver.Options{Addr: *addr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		os.Exit(1)
	}
	defer cp.Close()
	c, l, r, e := xdsserver.SmallMesh("v1", *ns)
	if err := cp.SetSnapshot("v1", c, l, r, e, nil); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		os.Exit(1)
	}
	fmt.Println(cp.Addr())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
