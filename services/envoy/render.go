package envoy

import "github.com/meshagent/meshagent/services/envoy/bootstrap"

// render returns the bootstrap of cfg, rendered for the first start and
// written again from the kept bytes after (bootstrap.Rendered says why).
func (cfg Config) render(kept *bootstrap.Rendered) (*bootstrap.Rendered, error) {
	if kept != nil {
		if err := kept.Rewrite(); err != nil {
			return nil, err
		}
		return kept, nil
	}
	return bootstrap.Render(*cfg.Bootstrap)
}
