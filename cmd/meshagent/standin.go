package main

import (
	"bytes"
	"debug/elf"
	"io"
)

// standInEnvoyPackage is the stand-in Envoy's Go package (testdata/fakeenvoy).
const standInEnvoyPackage = "github.com/meshagent/meshagent/testdata/fakeenvoy"

// describeEnvoy is the Envoy binary as the agent's first log line names it:
// its path, and when it is the stand-in, that it is one (#20). The stand-in
// is told by the Go build information it carries (a section of the file is
// read and nothing is run); a real Envoy, a C++ binary, has none. So the
// image that ships the stand-in as /usr/local/bin/envoy says so in the log
// of every pod that runs it, with nothing to configure.
func describeEnvoy(path string) string {
	if isStandInEnvoy(path) {
		return path + " (the stand-in Envoy, testdata/fakeenvoy: a test tool that speaks xDS and SDS and relays " +
			"captured TCP to its original destination, but is no Envoy: no TLS, routing or load balancing)"
	}
	return path
}

// maxBuildInfo bounds the section read: a Go binary's build information is
// a few kB (its module list).
const maxBuildInfo = 1 << 20

// isStandInEnvoy: path is an ELF file whose Go build information names the
// stand-in's main package, on the "path" line `go version -m` prints.
// debug/buildinfo would parse the whole of it, but links the readers of
// Mach-O, PE and XCOFF files with it: 0.42 MB of the agent's binary for a
// check that only ever meets Linux executables (#36). debug/elf is linked
// for meshagent image anyway.
func isStandInEnvoy(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	s := f.Section(".go.buildinfo")
	if s == nil {
		return false
	}
	b, err := io.ReadAll(io.LimitReader(s.Open(), maxBuildInfo))
	return err == nil && bytes.Contains(b, []byte("path\t"+standInEnvoyPackage+"\n"))
}
