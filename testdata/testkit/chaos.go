package testkit

import (
	"os"
	"testing"
)

// ChaosLongEnv, set to anything, asks the chaos tests for their long form
// (`make chaos`).
const ChaosLongEnv = "MESHAGENT_CHAOS_LONG"

// ChaosRounds is how many rounds a chaos test runs: normal, long under
// ChaosLongEnv, short under -short (the long form wins).
func ChaosRounds(normal, long, short int) int {
	switch {
	case os.Getenv(ChaosLongEnv) != "":
		return long
	case testing.Short():
		return short
	}
	return normal
}
