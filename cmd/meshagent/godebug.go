// The Go runtime's once-a-second check of the CPU limit (Go 1.25+,
// updatemaxprocs) is off (#36): with a readiness probe or any request in
// each second, sysmon re-reads the CPU affinity and the cgroup's quota every
// second, which cost the idle agent about 100 µs a second, a fifth of its
// idle CPU (docs/performance.md, "What wakes the agent at idle"). GOMAXPROCS
// is still set from the container's CPU limit at start (containermaxprocs);
// it no longer follows a limit resized in place while the pod runs, as
// Envoy's worker count (--concurrency, fixed at start) never has, and as Go
// agents did before 1.25. GODEBUG=updatemaxprocs=1 turns it back on.

//go:debug updatemaxprocs=0

package main
