package envoy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
)

// Why the bootstrap is rendered in a child process, once.
//
// Rendering the built-in bootstrap builds about a hundred Envoy proto types
// through protobuf reflection (protojson, anypb), and the protobuf runtime
// keeps what it builds for each type (full descriptors, field coders, JSON
// names) for the life of the process: 1.9 MB of live heap, about 2.6 MiB of
// resident memory at the agent's GC target, paid in every pod for a file
// written once (issue 11: the idle agent under 25 MiB). So the agent runs
// its own executable with RenderCommand to render it, and keeps the bytes:
// a restarted Envoy gets the same file written again from them, with no
// child and no proto work, as Istio's agent renders its bootstrap once per
// start of the agent.

// RenderCommand, as the first argument of the agent's executable, makes the
// process a bootstrap renderer (RenderMain) instead of an agent.
const RenderCommand = "__render-bootstrap"

// renderTimeout bounds a renderer child: it reads a few small files and
// writes one.
const renderTimeout = 30 * time.Second

// renderRequest is what a renderer child reads on stdin: the BootstrapConfig
// with its ProxyConfig as proto JSON (the one field encoding/json cannot
// carry).
type renderRequest struct {
	Config BootstrapConfig
	Proxy  json.RawMessage
}

// renderResult is what a renderer child writes on stdout.
type renderResult struct {
	Bootstrap Bootstrap
	Error     string `json:",omitempty"`
}

// RenderMain is the renderer child: it reads a request on in, writes the
// bootstrap (WriteBootstrap) and the result on out. An error is returned
// only when no result could be written.
func RenderMain(in io.Reader, out io.Writer) error {
	var req renderRequest
	if err := json.NewDecoder(in).Decode(&req); err != nil {
		return fmt.Errorf("render bootstrap: read request: %w", err)
	}
	var res renderResult
	req.Config.Proxy = &meshv1alpha1.ProxyConfig{}
	if err := protojson.Unmarshal(req.Proxy, req.Config.Proxy); err != nil {
		res.Error = fmt.Sprintf("render bootstrap: ProxyConfig: %v", err)
	} else if b, err := WriteBootstrap(req.Config); err != nil {
		res.Error = err.Error()
	} else {
		res.Bootstrap = b
	}
	return json.NewEncoder(out).Encode(res)
}

// renderInChild runs exe as a renderer child for c.
func renderInChild(exe string, c BootstrapConfig) (Bootstrap, error) {
	pc, err := protojson.Marshal(c.Proxy)
	if err != nil {
		return Bootstrap{}, fmt.Errorf("render bootstrap: ProxyConfig: %w", err)
	}
	req, err := json.Marshal(renderRequest{Config: c, Proxy: pc})
	if err != nil {
		return Bootstrap{}, fmt.Errorf("render bootstrap: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), renderTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, RenderCommand)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(req), &stdout, &stderr
	runErr := cmd.Run()
	var res renderResult
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil || runErr != nil {
		why := strings.TrimSpace(stderr.String())
		if runErr != nil {
			why = strings.TrimSpace(runErr.Error() + ": " + why)
		}
		return Bootstrap{}, fmt.Errorf("render bootstrap in %s %s: %s", exe, RenderCommand, why)
	}
	if res.Error != "" {
		return Bootstrap{}, errors.New(res.Error)
	}
	return res.Bootstrap, nil
}

// renderedBootstrap is a bootstrap as first written: later starts write the
// same bytes again rather than render.
type renderedBootstrap struct {
	boot Bootstrap
	data []byte // the file's content; nil for a custom config file, used as is
}

// render returns the bootstrap of cfg, rendered (in a child when
// cfg.RenderExe is set) the first time and written again from the kept
// bytes after.
func (cfg Config) render(kept *renderedBootstrap) (*renderedBootstrap, error) {
	if kept != nil {
		if kept.data != nil {
			if err := writeAtomic(kept.boot.Path, kept.data); err != nil {
				return nil, err
			}
		}
		return kept, nil
	}
	var (
		b   Bootstrap
		err error
	)
	if cfg.RenderExe != "" {
		b, err = renderInChild(cfg.RenderExe, *cfg.Bootstrap)
	} else {
		b, err = WriteBootstrap(*cfg.Bootstrap)
	}
	if err != nil {
		return nil, err
	}
	r := &renderedBootstrap{boot: b}
	if !b.Custom {
		if r.data, err = os.ReadFile(b.Path); err != nil {
			return nil, fmt.Errorf("read the rendered bootstrap: %w", err)
		}
	}
	return r, nil
}
