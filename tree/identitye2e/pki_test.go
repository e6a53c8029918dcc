package identitye2e

import (
	"testing"
	"time"

	"github.com/meshagent/meshagent/testdata/testkit/istioca"
)

// e2eWorkloadID is the identity of the file-mounted test certificates.
const e2eWorkloadID = "spiffe://cluster.local/ns/default/sa/e2e"

// testToken is the bearer token the test CA wants.
const testToken = "e2e-token"

// startCA is the agent's own CA (the test kit's istioca) issuing
// certificates of lifetime to holders of testToken.
func startCA(t *testing.T, lifetime time.Duration) *istioca.CA {
	t.Helper()
	return istioca.Start(t, istioca.Options{Lifetime: lifetime, Token: testToken})
}
