package xdsproxy

import (
	"strings"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// At debug level each push is logged with the names it added, removed and
// changed for Envoy (issue 22), on both protocols.
func TestPushDiffLoggedAtDebug(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		cp, p, c := clientAtV1(t, delta)
		first := xdsserver.ClusterName("svc-v1-", 0) + " " + xdsserver.ClusterName("svc-v1-", 1)
		p.logs.WaitLine(t, "msg=push", "type_url="+clusterType, "version=v1", `added="[`+first+`]"`)

		snapshot(t, cp, "v2", 1) // svc-v2-0 replaces both
		if err := c.WaitFor(waitCtx(t), hasVersion(clusterType, "v2", 1)); err != nil {
			t.Fatal(err)
		}
		p.logs.WaitLine(t, "msg=push", "type_url="+clusterType, "version=v2",
			`added=[`+xdsserver.ClusterName("svc-v2-", 0)+`]`, `removed="[`+first+`]"`)
		if strings.Contains(p.logs.String(), "push diff: response not decoded") {
			t.Errorf("a response was not decoded:\n%s", p.logs)
		}
	})
}
