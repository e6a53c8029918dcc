package tree

import "github.com/meshagent/meshagent/messages"

// Channels are every channel of the agent. The tree creates them once and
// they outlive every service restart: a restarted service finds the latest
// values and the queued events where its predecessor left them.
type Channels struct {
	Certs     *messages.Cell[messages.CertBundle]
	Names     *messages.Cell[messages.NameTable]
	DNS       *messages.Cell[messages.DNSTable]
	Envoy     *messages.Cell[messages.EnvoyState]
	Tree      *messages.Cell[messages.TreeState]
	Readiness *messages.Cell[messages.Readiness]
	XDS       *messages.Cell[messages.XDSState]
	Anchors   *messages.Cell[messages.TrustAnchors]
	Workload  *messages.Cell[messages.WorkloadHealth]
	Health    *messages.Stream[messages.Health]
	Drain     *messages.Stream[messages.Drain]
	Shutdown  *messages.Stream[messages.Shutdown]
	Chaos     *messages.Stream[messages.Chaos]
}

// NewChannels makes the channels. onHealthDropped is called when the health
// stream overflows (the status server fell far behind).
func NewChannels(onHealthDropped func(total uint64)) *Channels {
	return &Channels{
		Certs:     messages.NewCell[messages.CertBundle](),
		Names:     messages.NewCell[messages.NameTable](),
		DNS:       messages.NewCell[messages.DNSTable](),
		Envoy:     messages.NewCell[messages.EnvoyState](),
		Tree:      messages.NewCell[messages.TreeState](),
		Readiness: messages.NewCell[messages.Readiness](),
		XDS:       messages.NewCell[messages.XDSState](),
		Anchors:   messages.NewCell[messages.TrustAnchors](),
		Workload:  messages.NewCell[messages.WorkloadHealth](),
		Health:    messages.NewStream[messages.Health](0, onHealthDropped),
		Drain:     messages.NewStream[messages.Drain](16, nil),
		Shutdown:  messages.NewStream[messages.Shutdown](16, nil),
		Chaos:     messages.NewStream[messages.Chaos](16, nil),
	}
}
