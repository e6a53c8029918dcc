// Package pushdiff tells what each response of the control plane changes
// of what Envoy was last sent, per type: the resource names it added,
// removed and changed, for the XDS proxy's debug log of each push (issue
// 22).
//
// It owns the record of what was sent (a name and a hash of the bytes per
// resource) and the diff; it does not own when to diff: the proxy decodes
// responses for it only when debug logging is on, so that the push path
// costs nothing more otherwise. It was part of package xdsproxy until #34
// split the proxy into packages a reader can hold.
package pushdiff

import (
	"crypto/sha256"
	"slices"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
)

// Diff is what a stream last sent Envoy, per type: each resource's name
// and a hash of its bytes. Touched only by the stream's responder.
type Diff struct {
	held map[string]map[string][32]byte
}

// New is an empty Diff: nothing sent yet.
func New() *Diff { return &Diff{held: map[string]map[string][32]byte{}} }

// Apply records response f and returns the names it added, removed and
// changed, sorted. A SotW response of CDS or LDS is the whole set (names it
// lacks are removed); of other types it names the resources it carries.
func (d *Diff) Apply(f *rawxds.Frame, delta bool) (added, removed, changed []string, err error) {
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
		if f.TypeURL == resource.ClusterType || f.TypeURL == resource.ListenerType {
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
