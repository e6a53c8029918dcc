// Package identitye2e holds the end-to-end tests and benchmarks of the
// identity path: certs (files or CA) → CertBundle → sds → a real SDS client
// over the unix socket. It has no code of its own and nothing imports it;
// it is the one place where the two services meet, as they do in the tree.
package identitye2e
