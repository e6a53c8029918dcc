package controlplane

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/messages"
)

// state is what one run of Serve has loaded; only Serve's goroutine
// touches it.
type state struct {
	svc       *Service
	snapshots cache.SnapshotCache
	names     *cache.LinearCache

	version   string // of the snapshot served; "" before the first
	fileSum   string // hash of the file the snapshot came from
	lastError error  // of the last load, nil when it applied
}

// reload reads the mesh file and, when it changed, serves its resources
// under a new version. A file that does not load changes nothing.
func (st *state) reload(ctx context.Context) {
	s := st.svc
	mesh, raw, err := ReadMeshFile(s.cfg.MeshFile)
	if err != nil {
		st.lastError = err
		s.m.reloads.WithLabelValues("rejected").Inc()
		if st.version != "" {
			s.log.Warn("mesh file rejected, serving the last good one", "version", st.version, "error", err)
		} else {
			s.log.Warn("mesh file rejected, nothing to serve yet", "error", err)
		}
		return
	}
	st.lastError = nil
	sum := sha256.Sum256(raw)
	fileSum := hex.EncodeToString(sum[:])
	if fileSum == st.fileSum {
		s.m.reloads.WithLabelValues("unchanged").Inc()
		return
	}
	gen := generate(mesh)
	// The generation makes every version new while the process lives; the
	// file's hash makes a version from another run of the process name the
	// same content, so that an Envoy reconnecting with it is right to be
	// told nothing.
	version := fmt.Sprintf("%d-%s", s.generation+1, fileSum[:8])
	sidecar, err := cache.NewSnapshot(version, gen.sidecar)
	if err == nil {
		err = sidecar.Consistent()
	}
	var proxyless *cache.Snapshot
	if err == nil {
		proxyless, err = cache.NewSnapshot(version, gen.proxyless)
	}
	if err == nil {
		err = st.snapshots.SetSnapshot(ctx, groupSidecar, sidecar)
	}
	if err == nil {
		err = st.snapshots.SetSnapshot(ctx, groupProxyless, proxyless)
	}
	if err != nil {
		// A generated snapshot that go-control-plane refuses is a bug here,
		// not in the file; keep serving the last one and say so.
		st.lastError = fmt.Errorf("mesh file %s: generated snapshot %s: %w", s.cfg.MeshFile, version, err)
		s.m.reloads.WithLabelValues("rejected").Inc()
		s.log.Error("generated snapshot refused", "error", st.lastError)
		return
	}
	st.setNameTable(gen)
	s.generation++
	st.version, st.fileSum = version, fileSum
	s.m.reloads.WithLabelValues("applied").Inc()
	s.m.version.Set(float64(s.generation))
	s.log.Info("mesh loaded", "file", s.cfg.MeshFile, "version", version,
		"services", len(mesh.Services), "external_names", len(mesh.ExternalNames),
		"clusters", len(gen.sidecar[resource.ClusterType]))
}

// setNameTable replaces the table when it changed: the linear cache counts
// every update as a change and would push the same table again.
func (st *state) setNameTable(gen generated) {
	if cur, ok := st.names.GetResources()[NameTableResourceName]; ok && proto.Equal(cur, gen.nameTable) {
		return
	}
	st.names.SetResources(map[string]types.Resource{NameTableResourceName: gen.nameTable})
}

// report says how the service is: Ready when it serves the file as it is,
// Degraded when it serves an older version because the file is bad,
// Starting when it has nothing to serve.
func (st *state) report() {
	switch {
	case st.version == "" && st.lastError != nil:
		st.svc.health.Report(messages.Starting, "no mesh loaded yet: "+st.lastError.Error())
	case st.version == "":
		st.svc.health.Report(messages.Starting, "no mesh loaded yet")
	case st.lastError != nil:
		st.svc.health.Report(messages.Degraded, fmt.Sprintf("serving mesh version %s; the file's current content is rejected: %v", st.version, st.lastError))
	default:
		st.svc.health.Report(messages.Ready, "")
	}
}
