// Package testkit is the one test kit of meshagent's tests: what every
// service's tests need and would otherwise each write again.
//
//   - LogBuffer: a log sink safe for concurrent writers, and loggers for it
//     and for t.Log;
//   - Recorder and HealthRecorder: sinks that keep every value sent and wait,
//     bounded, for one that satisfies a test; WaitValue does the same for a
//     latest-value channel; Until is the wake-on-change wait under them
//     (and under xdsserver's WaitFor);
//   - ManualClock and FrozenClock: messages.Clock for tests that control time;
//   - Serve: a service's Serve in the background, stopped and checked at the
//     end of the test;
//   - Receiver: one bounded receive loop for a test's gRPC stream (Next, or
//     Quiet for a while without a response);
//   - CanRoot, RequireRoot, IsZombie, ProcStat, Dnsmasq: what tests that need root,
//     namespaces, child processes or a real resolver check and start;
//   - ChaosRounds: how many rounds a chaos test runs (short, or long);
//   - E2ESummary: an end-to-end suite's one-line outcome for `make test`;
//   - WaitFor, FreePort, FreeAddr, ShortTempDir, WriteFile, ReplaceFile,
//     MetricValue and MetricSample, Fetch and MustFetch, EachEditRejected,
//     Contains, LineDiff, AcceptAndClose: the small helpers around them.
//
// Sub-packages: pki (a test PKI: roots, intermediates, leaves with SPIFFE
// IDs, CRLs), istioca (the real services/ca started for a test that needs an
// Istio CA) and xdsserver (a real xDS control plane, on TCP or a unix
// socket, with a health-checked backend and an external SDS server for
// proxyless and identity tests).
//
// Every wait is bounded by Timeout: a deadlock detector, never a
// performance threshold. Like everything under testdata it is skipped by
// ./... patterns; its own tests run with `go test ./testdata/testkit/...`.
package testkit
