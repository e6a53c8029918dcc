// Package tree builds the agent's supervision tree and owns its channels.
//
// suture (github.com/thejerf/suture/v4) supervises the services, but it
// restarts a failed service at once and only backs off a whole supervisor.
// This package adds what a sidecar agent needs on top:
//
//   - a backoff runner around every service: the first restart at once, then
//     growing with jitter to a cap, reset after a period of health, and an
//     optional give-up limit after which the whole agent exits non-zero;
//   - subtrees that are rebuilt from scratch (a stopped suture supervisor
//     cannot be served again) when a group fails or is killed. No group
//     of the agent rebuilds on an event (#34 removed the trigger, which
//     only tests used): a group holds only services that must restart
//     together, and a service handles the events it depends on itself (the XDS proxy redials on new trust
//     roots; the DNS proxy and the name table, in their own "names" group,
//     are restarted by no root rotation, renewal or reconnect: #26);
//   - an event hook that never blocks and turns suture's events into Health
//     messages, log lines and Prometheus counters;
//   - the registry behind /debug/tree, published as a TreeState value;
//   - ordered shutdown: drain Envoy, wait for it, then stop the rest.
//
// tree is the only package of the agent that calls the services'
// constructors (docs/architecture.md names the benchmark mains and the test
// kit that run one service alone).
package tree
