package capture

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	runHelper()
	goleak.VerifyTestMain(m)
}
