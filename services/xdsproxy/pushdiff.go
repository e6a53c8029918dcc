package xdsproxy

// Each push's diff at debug level (issue 22): which resource names a
// response added, removed or changed for Envoy, so that an operator who
// turns on debug logging sees what moved, not only that a version did. The
// proxy forwards responses as bytes; only with debug on does it decode
// them for this, so the push path costs nothing more otherwise.

import (
	"context"
	"log/slog"

	"github.com/meshagent/meshagent/services/xdsproxy/lkg"
	"github.com/meshagent/meshagent/services/xdsproxy/pushdiff"
	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
)

// logPushDiff logs, at debug level, what response f changes of what the
// stream last sent Envoy.
func (st *stream[R]) logPushDiff(f *rawxds.Frame) {
	if !st.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	if st.diff == nil {
		st.diff = pushdiff.New()
	}
	added, removed, changed, err := st.diff.Apply(f, st.pr.Mode() == lkg.ModeDelta)
	if err != nil {
		st.log.Debug("push diff: response not decoded", "type_url", f.TypeURL, "error", err)
		return
	}
	st.log.Debug("push", "type_url", f.TypeURL, "version", f.Version, "nonce", f.Nonce,
		"added", added, "removed", removed, "changed", changed)
}
