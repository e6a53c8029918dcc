package main

// What a client sees while istiod is away and comes back (#36's reconnect
// storm): requests on a connection opened before, and a name the mesh
// learnt meanwhile.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"slices"
	"strings"
	"time"
)

// durations parses the arguments as durations, naming the one that is not.
func durations(args ...string) ([]time.Duration, error) {
	out := make([]time.Duration, len(args))
	for i, a := range args {
		d, err := time.ParseDuration(a)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("%q: want a positive duration", a)
		}
		out[i] = d
	}
	return out, nil
}

// keep GETs a URL at a steady pace on one kept-alive connection, until its
// stdin ends (the caller is done) or max has passed. A new connection
// counted in conns means the one before broke or was closed. The first
// answer is printed after "open": it says whom the server saw connect.
func keep(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("usage: keep URL EVERY MAX")
	}
	ds, err := durations(args[1], args[2])
	if err != nil {
		return err
	}
	url, every, maxDur := args[0], ds[0], ds[1]
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	c := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1, IdleConnTimeout: time.Hour},
	}
	var ok, fail, conns int
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if !info.Reused {
			conns++
		}
	}}
	end := time.After(maxDur)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := c.Do(req)
		var body []byte
		if err == nil {
			body, err = io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("%s", resp.Status)
			}
		}
		if err != nil {
			fail++
			fmt.Printf("fail %s %v\n", time.Now().UTC().Format(time.RFC3339Nano), err)
		} else {
			if ok == 0 {
				fmt.Println("open", strings.TrimSpace(string(body)))
			}
			ok++
		}
		select {
		case <-tick.C:
			continue
		case <-done:
		case <-end:
		}
		break
	}
	fmt.Printf("keep ok=%d fail=%d conns=%d\n", ok, fail, conns)
	return nil
}

// resolveWait resolves a name every 100 ms until one of its addresses is
// want, and prints when.
func resolveWait(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("usage: resolvewait NAME WANT MAX")
	}
	ds, err := durations(args[2])
	if err != nil {
		return err
	}
	name, want := args[0], args[1]
	var last string
	for end := time.Now().Add(ds[0]); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		addrs, err := net.DefaultResolver.LookupHost(ctx, name)
		cancel()
		if slices.Contains(addrs, want) {
			fmt.Println("resolved", time.Now().UTC().Format(time.RFC3339Nano))
			return nil
		}
		last = fmt.Sprint(addrs, err)
	}
	return fmt.Errorf("%s did not resolve to %s within %v (last: %s)", name, want, ds[0], last)
}
