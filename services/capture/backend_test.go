package capture

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

func TestBackendChoose(t *testing.T) {
	both := Residue{Iptables: true, Nftables: true, IptablesUsable: true, NftablesUsable: true}
	for _, tc := range []struct {
		name          string
		r             Residue
		nft, forceIpt bool
		want          Backend
		wantErr       []string // every string the error names
	}{
		{"fresh node: Istio's default", Residue{IptablesUsable: true, NftablesUsable: true}, false, false, BackendIptables, nil},
		{"fresh node without iptables (RHEL 10)", Residue{NftablesUsable: true}, false, false, BackendNftables, nil},
		{"nothing usable: iptables, whose error names the package", Residue{}, false, false, BackendIptables, nil},
		{"our nft tables present: stay on nft", Residue{Nftables: true, IptablesUsable: true, NftablesUsable: true}, false, false, BackendNftables, nil},
		{"ISTIO_ chains present: stay on iptables", Residue{Iptables: true, IptablesUsable: true, NftablesUsable: true}, false, false, BackendIptables, nil},
		{"--native-nftables", Residue{IptablesUsable: true, NftablesUsable: true}, true, false, BackendNftables, nil},
		{"--native-nftables over our own tables", Residue{Nftables: true, NftablesUsable: true}, true, false, BackendNftables, nil},
		{"--force-iptables-binary", Residue{NftablesUsable: true}, false, true, BackendIptables, nil},
		{"mixed", both, false, false, "", []string{"ISTIO_* iptables chains", "inet istio-proxy-"}},
		{"mixed, even with a flag", both, true, false, "", []string{"ISTIO_* iptables chains", "inet istio-proxy-"}},
		{"--native-nftables beside iptables rules", Residue{Iptables: true, IptablesUsable: true, NftablesUsable: true}, true, false, "", []string{"--native-nftables", "ISTIO_* iptables chains"}},
		{"--force-iptables-binary beside nft tables", Residue{Nftables: true, IptablesUsable: true, NftablesUsable: true}, false, true, "", []string{"--force-iptables-binary", "inet istio-proxy-"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why, err := tc.r.Choose(tc.nft, tc.forceIpt)
			if tc.wantErr != nil {
				if !errors.Is(err, ErrMixedBackends) {
					t.Fatalf("Choose = %q, %v; want ErrMixedBackends", got, err)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not name %q", err, w)
					}
				}
				return
			}
			if err != nil || got != tc.want || why == "" {
				t.Errorf("Choose = %q (%q), %v; want %q with a reason", got, why, err, tc.want)
			}
		})
	}
}

// TestProbeResidueInNetns: what ProbeResidue finds follows what is applied,
// and a node holding both sets is refused by name.
func TestProbeResidueInNetns(t *testing.T) {
	requireNft(t)
	if !inNetns(t) {
		return
	}
	ctx, log := context.Background(), testkit.TestLogger(t)
	probe := func() Residue {
		t.Helper()
		r, err := ProbeResidue(ctx, log)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := probe(); r.Iptables || r.Nftables || !r.IptablesUsable || !r.NftablesUsable {
		t.Fatalf("fresh namespace: %+v", r)
	}
	cfg := sidecarConfig(t, false, "")
	n, err := NewNftApplier(log)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Apply(ctx, BuildNft(cfg)); err != nil {
		t.Fatal(err)
	}
	if r := probe(); !r.Nftables || r.Iptables {
		t.Fatalf("after the nft apply: %+v", r)
	} else if b, _, _ := r.Choose(false, false); b != BackendNftables {
		t.Errorf("after the nft apply, neither flag chooses %q", b)
	}
	a, err := NewApplier("", false, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Apply(Build(cfg), false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := probe().Choose(false, false); !errors.Is(err, ErrMixedBackends) {
		t.Errorf("both sets present: Choose error %v, want ErrMixedBackends", err)
	}
}
