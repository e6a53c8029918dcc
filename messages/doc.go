// Package messages holds what the agent's services say to each other and the
// two kinds of channel they say it on.
//
// A service never calls another service. It receives, at construction, the
// read side of the values it consumes and the write side of the values it
// produces, typed by message:
//
//   - Latest[T] / Cell[T]: a latest-value channel. A send replaces the unread
//     value, a writer never blocks, and a reader that (re)starts sees the
//     current value at once. Used for state: CertBundle, TrustAnchors,
//     NameTable, DNSTable, XDSState, EnvoyState, WorkloadHealth, TreeState,
//     Readiness.
//   - Stream[T]: a buffered, single-consumer event stream. A send never blocks
//     and is never dropped silently: past the bound the oldest event is
//     dropped, counted and reported. Used for events and commands: Health,
//     Drain, Shutdown, Chaos.
//
// The channels are created by package tree (tree.Channels, which lists every
// one) and outlive service restarts.
package messages
