package xdsserver

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// RoundClusters makes n clusters with the same names every round and a
// content that changes with round, so that a Delta control plane resends
// every one of them (it skips resources whose hash did not change).
func RoundClusters(n, round int) []types.Resource {
	out := make([]types.Resource, n)
	for i := range n {
		c := Cluster(ClusterName("svc", i))
		c.ConnectTimeout = durationpb.New(time.Second + time.Duration(round)*time.Millisecond)
		out[i] = c
	}
	return out
}

// Push sets a snapshot of clusters at version for node (Options.ByNode)
// and waits until c holds all of them at that version. It returns the
// time from the snapshot to the client holding it.
func Push(ctx context.Context, s *Server, c *Client, node, version string, clusters []types.Resource) (time.Duration, error) {
	start := time.Now()
	if err := s.SetNodeSnapshot(node, version, clusters, nil, nil, nil); err != nil {
		return 0, err
	}
	n := len(clusters)
	if err := c.WaitFor(ctx, func(st State) bool {
		return st.Versions[resource.ClusterType] == version && st.Counts[resource.ClusterType] == n
	}); err != nil {
		return 0, fmt.Errorf("push %s of %d clusters to %s: %w", version, n, node, err)
	}
	return time.Since(start), nil
}

// Quantile is the q-quantile (0..1) of ds, by nearest rank.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}
