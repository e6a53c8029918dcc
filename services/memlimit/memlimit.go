// Package memlimit sets Go's soft memory limit from the memory limit of the
// agent's cgroup, as Istio's pilot-agent does by importing automemlimit
// (#36). It is the process's, not a service: cmd calls it once at start,
// and it reads the cgroup through services/internal/cgroupmem, the one
// place the agent reads it (which cmd cannot import).
package memlimit

import (
	"errors"
	"log/slog"
	"runtime/debug"

	"github.com/meshagent/meshagent/services/internal/cgroupmem"
)

// Apply sets Go's memory limit to ratio of the memory limit of the calling
// process's cgroup (the container's: Envoy's share is in it too) and
// returns it; 0, and nothing set, when ratio is 0 (AUTOMEMLIMIT=off, or
// GOMEMLIMIT set: Go's runtime applies that itself) or the cgroup has no
// limit, as automemlimit. root is where "/" is (cgroupmem.Self). Under
// the limit the GC collects sooner and the scavenger returns pages rather
// than the container being OOM-killed; far from it (a pod's limit is
// hundreds of MiB, the agent idles at a few) it changes nothing.
func Apply(ratio float64, root string, log *slog.Logger) int64 {
	if ratio <= 0 {
		return 0
	}
	m, err := cgroupmem.Self(root)
	if errors.Is(err, cgroupmem.ErrUnknown) || (err == nil && m.Limit == 0) {
		log.Debug("no memory limit for Go: the agent's cgroup has none", "error", err)
		return 0
	}
	if err != nil {
		log.Warn("no memory limit for Go: the agent's cgroup could not be read", "error", err)
		return 0
	}
	limit := int64(float64(m.Limit) * ratio)
	debug.SetMemoryLimit(limit)
	log.Info("Go's memory limit, from the cgroup's", "limit", limit, "cgroupLimit", m.Limit, "ratio", ratio, "cgroup", m.Dir)
	return limit
}
