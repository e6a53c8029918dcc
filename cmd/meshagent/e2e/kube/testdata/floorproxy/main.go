// floorproxy is the start storm's floor (#36, STORM_FLOOR=1): a sidecar
// that costs nothing, in the place of Istio's pilot-agent in an image of its
// own. It is what no agent can beat: the storm's pods with it still pay for
// the node's work (the sandbox, the three containers' starts, the probes,
// the API server's writes), but for no capture, no key, no CSR, no Envoy
// and no xDS.
//
//	floorproxy proxy ...    answers 200 on :15021 and :15020 /healthz/ready
//	                        at once, and forwards the rewritten application
//	                        probes (/app-health/..., ISTIO_KUBE_APP_PROBERS)
//	                        to the app as Istio's agent does, so that the
//	                        pod turns Ready when its app does, no sooner;
//	                        exits 0 on SIGTERM
//	floorproxy anything else   exits 0 (istio-iptables in istio-init, the
//	                        native sidecar's preStop `request ... drain`)
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "proxy" {
		return
	}
	if err := serve(); err != nil {
		fmt.Fprintln(os.Stderr, "floorproxy:", err)
		os.Exit(1)
	}
}

// appProbe is one entry of ISTIO_KUBE_APP_PROBERS, as Istio's injector
// writes it: the probe's path on 15020, and the app's original HTTP probe.
type appProbe struct {
	HTTPGet *struct {
		Path string          `json:"path"`
		Port json.RawMessage `json:"port"`
	} `json:"httpGet"`
}

func serve() error {
	probers := map[string]appProbe{}
	if v := os.Getenv("ISTIO_KUBE_APP_PROBERS"); v != "" {
		if err := json.Unmarshal([]byte(v), &probers); err != nil {
			return fmt.Errorf("ISTIO_KUBE_APP_PROBERS: %v", err)
		}
	}
	host := os.Getenv("INSTANCE_IP")
	if host == "" {
		host = "127.0.0.1"
	}
	client := &http.Client{Timeout: time.Second}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz/ready", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("/app-health/", func(w http.ResponseWriter, r *http.Request) {
		p, ok := probers[r.URL.Path]
		if !ok || p.HTTPGet == nil {
			http.NotFound(w, r)
			return
		}
		var port int
		if err := json.Unmarshal(p.HTTPGet.Port, &port); err != nil {
			var s string
			_ = json.Unmarshal(p.HTTPGet.Port, &s)
			port, _ = strconv.Atoi(s)
		}
		resp, err := client.Get("http://" + net.JoinHostPort(host, strconv.Itoa(port)) + p.HTTPGet.Path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
	})
	errs := make(chan error, 2)
	for _, addr := range []string{":15021", ":15020"} {
		go func() { errs <- http.ListenAndServe(addr, mux) }()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	select {
	case err := <-errs:
		return err
	case <-ctx.Done():
		return nil
	}
}
