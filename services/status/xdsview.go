package status

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/meshagent/meshagent/messages"
)

// The XDS proxy's upstream in /debug/tree (issue 12): the tree says the
// xds service runs, not whether Envoy is getting configuration from the
// control plane or from the proxy's cache, nor what Envoy last accepted.

// XDSReport is the "xds" object of /debug/tree?format=json and the body
// of /debug/xds; `meshagent proxy-status` decodes it (one wire type for
// both ends).
type XDSReport struct {
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
	// Types is, by type URL, what went to Envoy, its ACK or NACK, and
	// the verdict (issue 22; `meshagent proxy-status` prints it).
	Types map[string]XDSTypeReport `json:"types,omitempty"`
}

// XDSTypeReport is one type of the "types" object.
type XDSTypeReport struct {
	Short   string `json:"short"` // cds, lds, ...
	Verdict string `json:"verdict"`
	messages.XDSTypeState
}

// StaleAfter is how long a response may wait for Envoy's ACK before the
// type is STALE: Envoy ACKs in milliseconds, a warming cluster's EDS in
// seconds.
const StaleAfter = 10 * time.Second

// xdsReport is what /debug/tree shows of the XDS proxy.
type xdsReport struct {
	state    messages.XDSState
	reported bool
	now      time.Time // for the verdicts
}

// xdsReport reads the XDS proxy's state; nil when there is no XDS proxy.
func (s *Service) xdsReport() *xdsReport {
	if s.in.XDS == nil {
		return nil
	}
	st, ok := s.in.XDS.Get()
	return &xdsReport{state: st, reported: ok, now: s.clock.Now()}
}

// json is the report as the "xds" object; nil for a nil report.
func (r *xdsReport) json() *XDSReport {
	if r == nil {
		return nil
	}
	if !r.reported {
		return &XDSReport{}
	}
	st := r.state
	v := &XDSReport{Reported: true, Upstream: st.Upstream.String(), Address: st.Address,
		LastError: st.LastError, LastACK: st.LastACK, Types: map[string]XDSTypeReport{}}
	for typeURL, t := range st.Types {
		v.Types[typeURL] = XDSTypeReport{Short: shortTypeName(typeURL), Verdict: st.Verdict(typeURL, r.now, StaleAfter), XDSTypeState: t}
	}
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
	for _, typeURL := range slices.Sorted(maps.Keys(st.Types)) {
		t := st.Types[typeURL]
		verdict := st.Verdict(typeURL, r.now, StaleAfter)
		l := fmt.Sprintf("  %-5s %-13s sent %s (%d resources) at %s; acked %s", shortTypeName(typeURL), verdict,
			t.SentVersion, t.SentResources, t.SentAt.UTC().Format(time.RFC3339), t.ACKedVersion)
		if t.NACK != nil {
			l += fmt.Sprintf("; NACK of %s at %s: %s", t.NACK.Version, t.NACK.At.UTC().Format(time.RFC3339), oneLine(t.NACK.Error))
		}
		fmt.Fprintln(w, l)
	}
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
