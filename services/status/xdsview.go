package status

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/meshagent/meshagent/messages"
)

// The XDS proxy's upstream in /debug/tree (issue 12): the tree says the
// xds service runs, not whether Envoy is getting configuration from the
// control plane or from the proxy's cache, nor what Envoy last accepted.

// xdsJSON is the "xds" object of /debug/tree?format=json.
type xdsJSON struct {
	// Reported is false until the XDS proxy has published its state.
	Reported bool   `json:"reported"`
	Upstream string `json:"upstream,omitempty"` // messages.XDSUpstream's name
	Address  string `json:"address,omitempty"`
	// Since is when Upstream took its value; while the cache is served or
	// the upstream is down, when the control plane became unreachable.
	Since     *time.Time `json:"since,omitempty"`
	LastError string     `json:"last_error,omitempty"`
	// LastACK is the version Envoy last acknowledged, by type URL.
	LastACK map[string]string `json:"last_ack,omitempty"`
}

// xdsReport is what /debug/tree shows of the XDS proxy.
type xdsReport struct {
	state    messages.XDSState
	reported bool
}

// xdsReport reads the XDS proxy's state; nil when there is no XDS proxy.
func (s *Service) xdsReport() *xdsReport {
	if s.in.XDS == nil {
		return nil
	}
	st, ok := s.in.XDS.Get()
	return &xdsReport{state: st, reported: ok}
}

// json is the report as the "xds" object; nil for a nil report.
func (r *xdsReport) json() *xdsJSON {
	if r == nil {
		return nil
	}
	if !r.reported {
		return &xdsJSON{}
	}
	st := r.state
	v := &xdsJSON{Reported: true, Upstream: st.Upstream.String(), Address: st.Address,
		LastError: st.LastError, LastACK: st.LastACK}
	if !st.Since.IsZero() {
		since := st.Since.UTC()
		v.Since = &since
	}
	return v
}

// writeXDS is the line under the tree, nothing for a nil report:
//
//	xds upstream: connected to 127.0.0.1:15010 since T; last ACK: cds v3, lds v3
//	xds upstream: serving cached configuration, control plane 127.0.0.1:15010 unreachable since T (last error: ...)
func writeXDS(w io.Writer, r *xdsReport) {
	if r == nil {
		return
	}
	if !r.reported {
		fmt.Fprintln(w, "xds upstream: no report yet")
		return
	}
	st := r.state
	since := ""
	if !st.Since.IsZero() {
		since = " since " + st.Since.UTC().Format(time.RFC3339)
	}
	var line string
	switch st.Upstream {
	case messages.XDSConnected:
		line = "connected to " + st.Address + since
	case messages.XDSConnecting:
		line = "connecting to " + st.Address + since
	case messages.XDSServingCache:
		line = "serving cached configuration, control plane " + st.Address + " unreachable" + since
	case messages.XDSDown:
		line = "down, control plane " + st.Address + " unreachable" + since + ", no cached configuration to serve"
	case messages.XDSIdle:
		line = "idle (no Envoy stream)" + since
	default:
		line = st.Upstream.String() + since
	}
	// The proxy keeps its last error after the control plane is back:
	// it says why only while the control plane is unreachable.
	unreachable := st.Upstream == messages.XDSServingCache || st.Upstream == messages.XDSDown
	if st.LastError != "" && unreachable {
		line += " (last error: " + oneLine(st.LastError) + ")"
	}
	if acks := describeACKs(st.LastACK); acks != "" {
		line += "; last ACK: " + acks
	}
	fmt.Fprintln(w, "xds upstream: "+line)
}

// describeACKs is "cds v3, lds v3": each type by its short name, sorted.
func describeACKs(acks map[string]string) string {
	parts := make([]string, 0, len(acks))
	for typeURL, version := range acks {
		parts = append(parts, shortTypeName(typeURL)+" "+version)
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// shortTypeName is the xDS short name of a type URL ("cds" for
// type.googleapis.com/envoy.config.cluster.v3.Cluster), else the type's
// own name.
func shortTypeName(typeURL string) string {
	name := typeURL[strings.LastIndex(typeURL, "/")+1:]
	if i := strings.LastIndex(name, "."); i >= 0 {
		switch name[i+1:] {
		case "Cluster":
			return "cds"
		case "ClusterLoadAssignment":
			return "eds"
		case "Listener":
			return "lds"
		case "RouteConfiguration":
			return "rds"
		case "ScopedRouteConfiguration":
			return "srds"
		case "VirtualHost":
			return "vhds"
		case "Secret":
			return "sds"
		case "Runtime":
			return "rtds"
		case "NameTable":
			return "nds"
		case "ProxyConfig":
			return "pcds"
		}
		return name[i+1:]
	}
	return name
}
