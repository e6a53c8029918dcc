package main

import "debug/buildinfo"

// standInEnvoyPackage is the stand-in Envoy's Go package (testdata/fakeenvoy).
const standInEnvoyPackage = "github.com/meshagent/meshagent/testdata/fakeenvoy"

// describeEnvoy is the Envoy binary as the agent's first log line names it:
// its path, and when it is the stand-in, that it is one (#20). The stand-in
// is told by the Go build information it carries (debug/buildinfo reads a
// section of the file and runs nothing); a real Envoy, a C++ binary, has
// none. So the image that ships the stand-in as /usr/local/bin/envoy says
// so in the log of every pod that runs it, with nothing to configure.
func describeEnvoy(path string) string {
	if isStandInEnvoy(path) {
		return path + " (the stand-in Envoy, testdata/fakeenvoy: a test tool that speaks xDS and SDS and relays " +
			"captured TCP to its original destination, but is no Envoy: no TLS, routing or load balancing)"
	}
	return path
}

func isStandInEnvoy(path string) bool {
	info, err := buildinfo.ReadFile(path)
	return err == nil && info.Path == standInEnvoyPackage
}
