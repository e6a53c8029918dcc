// Package envoy runs Envoy as a child process of the agent and tells the rest
// of the agent what became of it.
//
// The Service starts Envoy (in its own process group, killed by the kernel if
// the agent dies), follows its admin /ready endpoint, publishes EnvoyState and
// Health, drains it on a Drain command the way Istio's pilot-agent does
// (POST /drain_listeners?inboundonly&graceful, then wait the termination drain
// duration or, when asked, until no connection is active), and stops it with
// SIGTERM then SIGKILL after a grace period.
//
// The Service never restarts Envoy itself: when Envoy exits, Serve publishes
// the exit and returns an error wrapping ErrEnvoyExited, and the supervision
// tree decides when (and whether) Serve runs again. Each Serve call starts one
// Envoy process; EnvoyState.Epoch counts them.
//
// With Config.HotRestart (opt-in, #25) a Serve call also watches what Envoy
// is started from and applies a change by an Envoy hot restart: the next
// epoch starts beside the running one and takes its listening sockets over
// (hotrestart.go, epochs.go, overlap.go). A crash still ends the Serve call, and the
// next one starts Envoy cold, as epoch 0.
//
// Before the first start the Service writes Envoy's bootstrap from
// Config.Bootstrap with package bootstrap (services/envoy/bootstrap, which
// builds it), and before each later start it writes the same bytes again;
// Envoy's command line is CommandLine (args.go) of Config.Args. Tests run
// Envoy on a hand-made bootstrap the way a user does: as the custom config
// file (bootstrap.Config.CustomConfigFile), used as is.
//
// testdata/fakeenvoy is a stand-in Envoy used by the tests; with
// MESHAGENT_TEST_ENVOY=/path/to/envoy the same tests run against a real one.
package envoy
