package xdsproxy

// Each push's diff at debug level (issue 22): which resource names a
// response added, removed or changed for Envoy, so that an operator who
// turns on debug logging sees what moved, not only that a version did. The
// proxy forwards responses as bytes; only with debug on does it decode
// them for this, so the push path costs nothing more otherwise.

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"slices"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/services/xdsproxy/lkg"
	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
)

// pushDiff is what a stream last sent Envoy, per type: each resource's name
// and a hash of its bytes. Touched only by the stream's responder.
type pushDiff struct {
	held map[string]map[string][32]byte
}

// logPushDiff logs, at debug level, what response f changes of what the
// stream last sent Envoy.
func (st *stream[R]) logPushDiff(f *rawxds.Frame) {
	if !st.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	if st.diff == nil {
		st.diff = &pushDiff{held: map[string]map[string][32]byte{}}
	}
	added, removed, changed, err := st.diff.apply(f, st.pr.mode() == lkg.ModeDelta)
	if err != nil {
		st.log.Debug("push diff: response not decoded", "type_url", f.TypeURL, "error", err)
		return
	}
	st.log.Debug("push", "type_url", f.TypeURL, "version", f.Version, "nonce", f.Nonce,
		"added", added, "removed", removed, "changed", changed)
}

// apply records response f and returns the names it added, removed and
// changed, sorted. A SotW response of CDS or LDS is the whole set (names it
// lacks are removed); of other types it names the resources it carries.
func (d *pushDiff) apply(f *rawxds.Frame, delta bool) (added, removed, changed []string, err error) {
	held := d.held[f.TypeURL]
	if held == nil {
		held = map[string][32]byte{}
		d.held[f.TypeURL] = held
	}
	seen := map[string]bool{}
	put := func(name string, b []byte) {
		sum := sha256.Sum256(b)
		seen[name] = true
		old, ok := held[name]
		switch {
		case !ok:
			added = append(added, name)
		case old != sum:
			changed = append(changed, name)
		}
		held[name] = sum
	}
	if delta {
		r := &discoveryv3.DeltaDiscoveryResponse{}
		if err := proto.Unmarshal(f.Body.Bytes(), r); err != nil {
			return nil, nil, nil, err
		}
		for _, res := range r.GetResources() {
			put(res.GetName(), res.GetResource().GetValue())
		}
		for _, name := range r.GetRemovedResources() {
			if _, ok := held[name]; ok {
				removed = append(removed, name)
				delete(held, name)
			}
		}
	} else {
		r := &discoveryv3.DiscoveryResponse{}
		if err := proto.Unmarshal(f.Body.Bytes(), r); err != nil {
			return nil, nil, nil, err
		}
		for _, a := range r.GetResources() {
			put(resourceNameOf(a), a.GetValue())
		}
		if f.TypeURL == clusterType || f.TypeURL == listenerType {
			for name := range held {
				if !seen[name] {
					removed = append(removed, name)
					delete(held, name)
				}
			}
		}
	}
	slices.Sort(added)
	slices.Sort(removed)
	slices.Sort(changed)
	return added, removed, changed, nil
}

// resourceNameOf is a SotW resource's name: Name, or ClusterName for an
// endpoint assignment; a resource of a type this binary does not know is
// named by its type.
func resourceNameOf(a *anypb.Any) string {
	m, err := a.UnmarshalNew()
	if err != nil {
		return "(undecoded " + a.GetTypeUrl() + ")"
	}
	if n, ok := m.(interface{ GetName() string }); ok && n.GetName() != "" {
		return n.GetName()
	}
	if n, ok := m.(interface{ GetClusterName() string }); ok {
		return n.GetClusterName()
	}
	return "(unnamed)"
}
