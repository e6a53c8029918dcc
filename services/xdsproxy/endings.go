package xdsproxy

import (
	"context"
	"errors"
	"io"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// How a stream's end is told to Envoy and counted.

// envoyError is what the handler returns to Envoy for an upstream or
// downstream error: nil for an orderly end (Istio's graceful
// termination), the gRPC status unchanged otherwise, so that Envoy logs
// the control plane's own reason.
func envoyError(err error) error {
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Unavailable, err.Error())
}

// expected is Istio's "expected error" (pilot/pkg/grpc GRPCErrorType): a
// peer that goes away in order.
func expected(err error) bool {
	if err == nil || errors.Is(err, io.EOF) {
		return true
	}
	st, ok := status.FromError(err)
	if ok && (st.Code() == codes.Canceled || st.Code() == codes.DeadlineExceeded) {
		return true
	}
	if ok && st.Code() == codes.Unavailable {
		for _, m := range []string{"client disconnected", "error reading from server: EOF", "transport is closing"} {
			if strings.Contains(st.Message(), m) {
				return true
			}
		}
	}
	msg := err.Error()
	return strings.Contains(msg, "stream terminated by RST_STREAM with error code: NO_ERROR") ||
		strings.Contains(msg, "received prior goaway: code: NO_ERROR")
}

// terminationLabel is the type label of Istio's termination counters.
func terminationLabel(err error) string {
	if expected(err) {
		return terminationCancelled
	}
	return terminationError
}
