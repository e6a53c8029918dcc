package xdsproxy

import "github.com/meshagent/meshagent/services/internal/boundedfile"

// The files the proxy reads that others write (the kubelet's token, the
// control plane's root), read as every such file is (issue #21): only a
// regular file, through a bound, so that a FIFO or a device there is an
// error naming it, not a dial that hangs or reads without end.

func readToken(path string) ([]byte, error) { return boundedfile.Read(path, boundedfile.MaxToken) }

func readPEMFile(path string) ([]byte, error) { return boundedfile.Read(path, boundedfile.MaxPEM) }
