package bootstrap

import (
	"crypto/sha256"
	"encoding/hex"
)

// The bootstrap is rendered for Envoy's first start only: a restarted Envoy
// gets the same file written again from the kept bytes, with no proto work
// (an Envoy crash is an outage for the pod; issue 11), and the same
// bootstrap, as with Istio's agent, which renders it once per start of the
// agent.
//
// Rendering it leaves no lasting state in the agent: it is built as plain
// JSON (json.go), not through protobuf-go, whose per-type state for Envoy's
// types (1.9 MB of live heap) would stay for the agent's life. Rendering in
// a short-lived child of the agent's own binary was tried first and not
// taken: the child's start-up (every package's init) added 65 ms to start →
// ready on a quiet machine (docs/performance.md, Memory).

// Rendered is a bootstrap as first written: later starts write the same
// bytes again (Rewrite) rather than render.
type Rendered struct {
	File
	data []byte // the file's content; nil for a custom config file, used as is
}

// Render is Write for a config already validated (the envoy service's,
// checked once by its New, #26), keeping what it wrote for Rewrite.
func Render(c Config) (*Rendered, error) {
	f, data, err := write(c)
	if err != nil {
		return nil, err
	}
	return &Rendered{File: f, data: data}, nil
}

// Rewrite writes the first render's bytes again, with no rendering: the
// inputs may have changed since, the bootstrap has not. A custom config
// file is Envoy's, used as is, and never written.
func (r *Rendered) Rewrite() error {
	if r.data == nil {
		return nil
	}
	return writeAtomic(r.Path, r.data)
}

// SHA256 identifies the bytes written, in hex; "" for a custom config file,
// which is not ours.
func (r *Rendered) SHA256() string {
	if r.data == nil {
		return ""
	}
	sum := sha256.Sum256(r.data)
	return hex.EncodeToString(sum[:])
}
