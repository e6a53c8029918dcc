// Package unique drops repeated values from a list and keeps the order
// of their first appearance: the order Envoy and Istio give names and
// addresses in (an SDS request's resource names, INSTANCE_IPS), which
// sorting would lose.
package unique

import "slices"

// Values is s without repeats, first appearances in order; s is unchanged.
func Values[T comparable](s []T) []T {
	out := make([]T, 0, len(s))
	for _, v := range s {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}
