package envoy

// The bootstrap is rendered for Envoy's first start only: a restarted Envoy
// gets the same file written again from the kept bytes, with no proto work
// (an Envoy crash is an outage for the pod; issue 11), and the same
// bootstrap, as with Istio's agent, which renders it once per start of the
// agent.
//
// Rendering it leaves no lasting state in the agent: it is built as plain
// JSON (bootstrap_json.go), not through protobuf-go, whose per-type state
// for Envoy's types (1.9 MB of live heap) would stay for the agent's life.
// Rendering in a short-lived child of the agent's own binary was tried
// first and not taken: the child's start-up (every package's init) added
// 65 ms to start → ready on a quiet machine (docs/performance.md, Memory).

// renderedBootstrap is a bootstrap as first written: later starts write the
// same bytes again rather than render.
type renderedBootstrap struct {
	boot Bootstrap
	data []byte // the file's content; nil for a custom config file, used as is
}

// render returns the bootstrap of cfg, rendered the first time and written
// again from the kept bytes after.
func (cfg Config) render(kept *renderedBootstrap) (*renderedBootstrap, error) {
	if kept != nil {
		if kept.data != nil {
			if err := writeAtomic(kept.boot.Path, kept.data); err != nil {
				return nil, err
			}
		}
		return kept, nil
	}
	b, data, err := writeBootstrapBytes(*cfg.Bootstrap)
	if err != nil {
		return nil, err
	}
	return &renderedBootstrap{boot: b, data: data}, nil
}
