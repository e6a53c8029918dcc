package xdsproxy

import (
	"context"
	"errors"
	"io"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/services/xdsproxy/protocol"
)

// Envoy gets the control plane's own status, or an OK end for an orderly
// one (Istio's graceful termination); the counters tell expected ends
// from errors as Istio's do.
func TestEndings(t *testing.T) {
	for _, tc := range []struct {
		err   error
		code  codes.Code // of envoyError; OK means nil
		label string
	}{
		{nil, codes.OK, terminationCancelled},
		{io.EOF, codes.OK, terminationCancelled},
		{status.Error(codes.Canceled, "context canceled"), codes.OK, terminationCancelled},
		{status.Error(codes.Unavailable, "transport is closing"), codes.Unavailable, terminationCancelled},
		{status.Error(codes.Unauthenticated, "bad token"), codes.Unauthenticated, terminationError},
		{status.Error(codes.ResourceExhausted, "rate limited"), codes.ResourceExhausted, terminationError},
		{errors.New("plain"), codes.Unavailable, terminationError},
		{context.Canceled, codes.OK, terminationError},
	} {
		got := envoyError(tc.err)
		if status.Code(got) != tc.code {
			t.Errorf("envoyError(%v) = %v, want code %v", tc.err, got, tc.code)
		}
		if l := terminationLabel(tc.err); l != tc.label {
			t.Errorf("terminationLabel(%v) = %s, want %s", tc.err, l, tc.label)
		}
	}
}

// Istio forwards Envoy's types (ECDS included, unchanged) and WDS, and
// keeps the agent's own.
func TestForwardable(t *testing.T) {
	for typ, want := range map[string]bool{
		clusterType: true, extensionConfigType: true, typePrefix + "istio.workload.Workload": true,
		nameTableType: false, proxyConfigType: false, healthInfoType: false,
		typePrefix + "example.Other": false,
	} {
		if protocol.Forwardable(typ) != want {
			t.Errorf("Forwardable(%s) = %v", typ, !want)
		}
	}
}
