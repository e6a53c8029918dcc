// kubeapp is the application container of the kube suite (#20): one static
// binary, so an image of it needs nothing else.
//
//	kubeapp serve [-addr :8080] [-events FILE] [-drain D] [-drain-get URL]
//	    answers "<pod> says hello" on /, 200 on /healthz; on SIGTERM appends
//	    "<time> <pod> app-term" to FILE, keeps serving for D (and GETs URL
//	    every 250 ms meanwhile, appending drain-get-ok or drain-get-fail:
//	    what an app finishing its work still sends through its sidecar),
//	    appends "<time> <pod> app-exit" and exits 0. From SIGTERM on it
//	    answers with "Connection: close", so that keep-alive clients move
//	    to the pods still serving, and at the end it closes gracefully,
//	    as an app that is rolled without failed requests does (#32).
//	kubeapp load URL     GETs URL without pause, for ever; every second
//	                     prints "count ok=N fail=M" (totals), each
//	                     failure as "fail <time> <error>", and each pod
//	                     that answers for the first time as "from <pod>"
//	kubeapp get URL      prints the body of a GET, exits 1 unless 200
//	kubeapp hold ADDR D  opens a TCP connection to ADDR and keeps it open for D
//	kubeapp resolve NAME prints NAME's addresses, resolved as any libc-free
//	                     Go program does (/etc/resolv.conf, UDP to its nameserver)
//	kubeapp keep URL EVERY MAX
//	                     GETs URL every EVERY on one kept-alive connection
//	                     until its stdin ends or MAX has passed: "open
//	                     <answer>" at the first answer, each failure as "fail <time>
//	                     <error>", then "keep ok=N fail=M conns=C", C the
//	                     connections it took (1: the first never broke)
//	kubeapp resolvewait NAME WANT MAX
//	                     resolves NAME every 100 ms until WANT is among its
//	                     addresses: prints "resolved <time>"; exits 1 after MAX
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kubeapp serve|get URL|load URL|hold ADDR D|resolve NAME|keep URL EVERY MAX|resolvewait NAME WANT MAX")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "get":
		err = get(os.Args[2])
	case "load":
		load(os.Args[2])
	case "hold":
		err = hold(os.Args[2], os.Args[3])
	case "keep":
		err = keep(os.Args[2:])
	case "resolvewait":
		err = resolveWait(os.Args[2:])
	case "resolve":
		var addrs []string
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		addrs, err = net.DefaultResolver.LookupHost(ctx, os.Args[2])
		for _, a := range addrs {
			fmt.Println(a)
		}
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeapp:", err)
		os.Exit(1)
	}
}

func hold(addr, d string) error {
	dur, err := time.ParseDuration(d)
	if err != nil {
		return err
	}
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	fmt.Println("holding", addr, "for", dur)
	time.Sleep(dur)
	return nil
}

func get(url string) error {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Print(string(body))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	addr := fs.String("addr", ":8080", "listen address")
	events := fs.String("events", "", "file to append termination events to")
	drain := fs.Duration("drain", 0, "how long to keep serving after SIGTERM")
	drainGet := fs.String("drain-get", "", "URL to GET every 250 ms while draining")
	_ = fs.Parse(args)
	pod := os.Getenv("POD_NAME")
	event := func(what string) {
		line := fmt.Sprintf("%s %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), pod, what)
		fmt.Print(line)
		if *events == "" {
			return
		}
		if f, err := os.OpenFile(*events, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o666); err == nil {
			f.WriteString(line)
			f.Close()
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s says hello to %s\n", pod, r.RemoteAddr)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	event("app-start")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	event("app-term")
	srv.SetKeepAlivesEnabled(false)
	for end := time.Now().Add(*drain); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if *drainGet == "" {
			continue
		}
		if err := get(*drainGet); err != nil {
			fmt.Println(err)
			event("drain-get-fail")
		} else {
			event("drain-get-ok")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(ctx)
	event("app-exit")
	return nil
}

// load is a client that never pauses: what a rollout must not fail. A
// request taking over 2 s counts as failed. Every 20th request closes its
// connection, so that new connections keep reaching every pod of the
// Service, a new one as soon as it is in the Service's endpoints (a client
// on one connection for ever would meet a new pod only when its old one
// drains).
func load(url string) {
	c := &http.Client{Timeout: 2 * time.Second}
	var ok, fail int
	seen := map[string]bool{}
	report := time.Now().Add(time.Second)
	for i := 0; ; i++ {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			fmt.Println("fail", err)
			return
		}
		req.Close = i%20 == 19
		resp, err := c.Do(req)
		if err == nil {
			var body []byte
			body, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("%s", resp.Status)
			}
			if pod, _, found := strings.Cut(string(body), " says hello"); err == nil && found && !seen[pod] {
				seen[pod] = true
				fmt.Printf("from %s\n", pod)
			}
		}
		if err != nil {
			fail++
			fmt.Printf("fail %s %v\n", time.Now().UTC().Format(time.RFC3339Nano), err)
			time.Sleep(10 * time.Millisecond) // a refused connection fails at once
		} else {
			ok++
		}
		if time.Now().After(report) {
			fmt.Printf("count ok=%d fail=%d\n", ok, fail)
			report = time.Now().Add(time.Second)
		}
	}
}
