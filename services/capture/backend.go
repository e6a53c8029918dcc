package capture

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
)

// Backend is how capture is programmed on a node.
type Backend string

const (
	BackendIptables Backend = "iptables"
	BackendNftables Backend = "nftables"
)

// ErrMixedBackends: capture rules of both backends would be (or are) on the
// node at once, so every connection would be redirected twice. Istio users
// met this when detection flip-flopped between restarts (istio#61020); here
// it is an error naming both, never a silent second set (#23).
var ErrMixedBackends = errors.New("capture rules of both backends")

// Residue is what a node holds: rules of ours per backend, and whether each
// backend's binaries work here.
type Residue struct {
	Iptables, Nftables             bool // ISTIO_* chains; tables inet istio-proxy-*
	IptablesUsable, NftablesUsable bool
}

// Choose picks the backend once, from what the node holds, so that every
// restart and every re-run of the init step lands on the same one: an
// explicit flag wins (and may not add a second set beside the other
// backend's rules); else the rules already present decide; else a node
// without usable iptables (RHEL 10) gets nftables; else Istio's default,
// iptables. The reason is for the log.
func (r Residue) Choose(nativeNftables, forceIptables bool) (Backend, string, error) {
	const iptRules, nftRules = "ISTIO_* iptables chains", "nftables tables inet istio-proxy-{nat,mangle,raw}"
	const remedy = "remove one set first (meshagent clean-iptables, with --native-nftables for the tables)"
	switch {
	case r.Iptables && r.Nftables:
		return "", "", fmt.Errorf("%w: both %s and %s are present; %s", ErrMixedBackends, iptRules, nftRules, remedy)
	case nativeNftables && r.Iptables:
		return "", "", fmt.Errorf("%w: --native-nftables asked for nftables, but %s are present; %s", ErrMixedBackends, iptRules, remedy)
	case forceIptables && r.Nftables:
		return "", "", fmt.Errorf("%w: --force-iptables-binary asked for iptables, but %s are present; %s", ErrMixedBackends, nftRules, remedy)
	case nativeNftables:
		return BackendNftables, "--native-nftables", nil
	case forceIptables:
		return BackendIptables, "--force-iptables-binary", nil
	case r.Nftables:
		return BackendNftables, "the node already holds our " + nftRules, nil
	case r.Iptables:
		return BackendIptables, "the node already holds " + iptRules, nil
	case !r.IptablesUsable && r.NftablesUsable:
		return BackendNftables, "iptables is not usable here and nft is", nil
	default:
		return BackendIptables, "no capture rules present: Istio's default", nil
	}
}

// ProbeResidue reads what the node holds with each backend whose binaries
// work. A backend that is not installed holds nothing; a permission error
// is returned (nothing can be decided, or changed, without it).
func ProbeResidue(ctx context.Context, log *slog.Logger) (Residue, error) {
	var r Residue
	if a, err := NewApplier("", false, log); err == nil {
		r.IptablesUsable = true
		for _, f := range []*family{a.v4, a.v6} {
			if f == nil {
				continue
			}
			out, err := a.run(f.save, "", nil)
			if err != nil {
				return r, err
			}
			r.Iptables = r.Iptables || ParseSave(out).Residue()
		}
	}
	n, err := NewNftApplier(log)
	switch {
	case errors.Is(err, ErrPermission):
		return r, err
	case err == nil:
		r.NftablesUsable = true
		st, err := n.State(ctx)
		if err != nil {
			return r, err
		}
		r.Nftables = st != ""
	}
	return r, nil
}
