package main

import (
	"math/rand/v2"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// Envoy's xDS retry (#24): a stream that ends is redialled after a fully
// jittered exponential backoff, not at a fixed pace, and only a response
// received on a stream resets it. A stand-in that redialled every 200 ms
// flattered every outage figure.
//
//   - The strategy is JitteredExponentialBackOffStrategy
//     (source/common/common/backoff_strategy.{h,cc}): the n-th delay is
//     uniform in [0, base·2ⁿ⁻¹) milliseconds, the interval doubling until
//     it would pass max/2 and then held at max.
//   - base and max are SubscriptionFactory::RetryInitialDelayMs = 500 and
//     RetryMaxDelayMs = 30000 (envoy/config/subscription_factory.h), unless
//     the API config source's first gRPC service has an envoy_grpc
//     retry_policy.retry_back_off (base_interval; max_interval, default 10×
//     base): Config::Utility::prepareJitteredExponentialBackOffStrategy
//     (source/common/config/utility.{h,cc}), called for the ADS mux in
//     source/common/upstream/cluster_manager_impl.cc and for each SDS
//     subscription by its subscription factory. Neither Istio's bootstrap
//     (tools/packaging/common/envoy_bootstrap.json) nor ours sets one.
//   - GrpcStream (source/common/config/grpc_stream.h) arms the retry timer
//     with nextBackOffMs() in onRemoteClose (and when a stream cannot be
//     started), and calls backoff_strategy_->reset() in onReceiveMessage.
const (
	retryInitialDelay = 500 * time.Millisecond
	retryMaxDelay     = 30 * time.Second
)

// backoff is one stream's JitteredExponentialBackOffStrategy. It is owned
// by the goroutine that redials the stream.
type backoff struct {
	base, max, next time.Duration
}

// newBackoff is the strategy for an API config source (nil: Envoy's
// defaults), as prepareJitteredExponentialBackOffStrategy builds it.
func newBackoff(src *corev3.ApiConfigSource) *backoff {
	base, max := retryInitialDelay, retryMaxDelay
	if svcs := src.GetGrpcServices(); len(svcs) > 0 {
		if rb := svcs[0].GetEnvoyGrpc().GetRetryPolicy().GetRetryBackOff(); rb != nil && rb.GetBaseInterval() != nil {
			base = rb.GetBaseInterval().AsDuration().Truncate(time.Millisecond)
			max = 10 * base
			if rb.GetMaxInterval() != nil {
				max = rb.GetMaxInterval().AsDuration().Truncate(time.Millisecond)
			}
		}
	}
	if base < time.Millisecond { // Envoy's config validation requires base_interval ≥ 1ms
		base = time.Millisecond
	}
	if max < base {
		max = base
	}
	return &backoff{base: base, max: max, next: base}
}

// nextDelay is nextBackOffMs: a random whole number of milliseconds below
// the current interval, which then doubles (capped at max).
func (b *backoff) nextDelay() time.Duration {
	interval := b.next
	if b.next < b.max/2 {
		b.next *= 2
	} else {
		b.next = b.max
	}
	return time.Duration(rand.Int64N(interval.Milliseconds())) * time.Millisecond
}

// reset is what a received response does: the next delay starts from base.
func (b *backoff) reset() { b.next = b.base }
