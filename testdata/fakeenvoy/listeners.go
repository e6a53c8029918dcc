package main

import (
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
)

// startListeners serves every static listener that has an HTTP connection
// manager with an inline route config, routing by path to static clusters
// or answering directly, as Istio's 15021 (/healthz/ready -> agent, or
// Envoy's own answer while the agent's runtime key says so) and 15090
// (/stats/prometheus -> admin) listeners need. Capture listeners are relay.go's; others are
// ignored.
func (e *envoy) startListeners() error {
	for _, l := range e.boot.GetStaticResources().GetListeners() {
		sa := l.GetAddress().GetSocketAddress()
		if sa == nil {
			continue
		}
		if usesOriginalDst(l) {
			continue // a capture listener: relayed (relay.go)
		}
		routes := e.httpRoutes(l)
		if routes == nil {
			log.Printf("listener %s: no HTTP connection manager with an inline route config; not served", l.GetName())
			continue
		}
		addr := net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
		ln, err := e.listen(l.GetName(), "tcp", addr)
		if err != nil {
			return fmt.Errorf("listener %q on %s: %w", l.GetName(), addr, err)
		}
		e.serve(ln, listenerStatName(l, sa), routes)
	}
	return nil
}

// listenerStatName is the name Envoy uses in listener.<name>.* stats: the
// stat_prefix, else the address as "0.0.0.0_15021".
func listenerStatName(l *listenerv3.Listener, sa *corev3.SocketAddress) string {
	if l.GetStatPrefix() != "" {
		return l.GetStatPrefix()
	}
	return fmt.Sprintf("%s_%d", sa.GetAddress(), sa.GetPortValue())
}

// httpRoutes builds a handler from the listener's first HTTP connection
// manager, or returns nil if it has none.
func (e *envoy) httpRoutes(l *listenerv3.Listener) http.Handler {
	for _, fc := range l.GetFilterChains() {
		for _, f := range fc.GetFilters() {
			hcm := &hcmv3.HttpConnectionManager{}
			if f.GetTypedConfig() == nil || f.GetTypedConfig().UnmarshalTo(hcm) != nil || hcm.GetRouteConfig() == nil {
				continue
			}
			return &router{e: e, vhosts: hcm.GetRouteConfig().GetVirtualHosts()}
		}
	}
	return nil
}

type router struct {
	e      *envoy
	vhosts []*routev3.VirtualHost
}

// ServeHTTP answers from the first route that matches the path (and its
// runtime_fraction, if any): its direct_response, or proxied to its
// cluster; 404 as Envoy when none does.
func (rt *router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	for _, vh := range rt.vhosts {
		for _, route := range vh.GetRoutes() {
			m := route.GetMatch()
			if !pathMatches(m, r.URL.Path) || (m.GetRuntimeFraction() != nil && !rt.e.fractionEnabled(m.GetRuntimeFraction())) {
				continue
			}
			if d := route.GetDirectResponse(); d != nil {
				body := d.GetBody().GetInlineString()
				if body != "" {
					w.Header().Set("Content-Type", "text/plain")
				}
				w.WriteHeader(int(d.GetStatus()))
				fmt.Fprint(w, body)
				return
			}
			cluster := route.GetRoute().GetCluster()
			target, err := rt.e.clusterURL(cluster)
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			p := httputil.NewSingleHostReverseProxy(target)
			p.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) {
				log.Printf("cluster %s: %v", cluster, err)
				http.Error(w, "upstream connect error or disconnect/reset before headers", http.StatusServiceUnavailable)
			}
			p.ServeHTTP(w, r)
			return
		}
	}
	http.NotFound(w, r)
}

func pathMatches(m *routev3.RouteMatch, path string) bool {
	switch {
	case m.GetPath() != "":
		return path == m.GetPath()
	case m.GetPrefix() != "" || m.GetPathSpecifier() == nil:
		return strings.HasPrefix(path, m.GetPrefix())
	}
	return false
}

// clusterURL is http://<first endpoint> of a static cluster.
func (e *envoy) clusterURL(name string) (*url.URL, error) {
	c := staticCluster(e.boot, name)
	if c == nil {
		return nil, fmt.Errorf("no static cluster %q", name)
	}
	sa := clusterAddress(c).GetSocketAddress()
	if sa == nil {
		return nil, fmt.Errorf("cluster %q has no socket address endpoint", name)
	}
	return &url.URL{Scheme: "http", Host: net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))}, nil
}
