package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

// The binary is built with the CPU-limit check off (godebug.go, #36): the
// go command records the main package's //go:debug settings as the build's
// DefaultGODEBUG, which the runtime reads at start.
func TestUpdateMaxProcsOff(t *testing.T) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("no build information in the binary")
	}
	for _, s := range info.Settings {
		if s.Key == "DefaultGODEBUG" && strings.Contains(","+s.Value+",", ",updatemaxprocs=0,") {
			return
		}
	}
	t.Fatalf("updatemaxprocs=0 is not in the build's DefaultGODEBUG: %v", info.Settings)
}
