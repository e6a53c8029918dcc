#!/usr/bin/env bash
# make bench-xds: meshagent's XDS proxy (bench/xds/xdsproxyd) and Istio's
# pilot-agent against a direct connection to the same control plane, in
# one run (bench/xds/xdsbench): CDS pushes of 1,000 and 10,000 clusters
# (State of the World and Delta, medians of ROUNDS), small updates (added
# latency p50/p99 over SMALL updates), and each proxy's peak RSS.
#
# pilot-agent comes from $ISTIO_AGENT (default ~/.cache/meshagent-peers/
# pilot-agent, built by ../shared/peers/istio-agent/build.sh); without it
# only meshagent is measured. It runs in a temp dir with Envoy disabled,
# file-mounted dev certs, plaintext to the control plane, and no DNS
# capture, so that its DNS proxy never forwards to this machine's resolver.
set -euo pipefail

ROUNDS=${ROUNDS:-31}
SMALL=${SMALL:-500}
SIZES=${SIZES:-1000,10000}
# NOCACHE=1 also runs meshagent without its last-known-good cache.
NOCACHE=${NOCACHE:-0}
ISTIO_AGENT=${ISTIO_AGENT:-$HOME/.cache/meshagent-peers/pilot-agent}
cd "$(dirname "$0")/../.."

work=$(mktemp -d /tmp/xdsbench.XXXXXX)
trap 'rm -rf "$work"' EXIT

go build -o "$work/xdsproxyd" ./bench/xds/xdsproxyd
go build -o "$work/xdsbench" ./bench/xds/xdsbench

istio_flags=()
if [ -x "$ISTIO_AGENT" ]; then
	mkdir -p "$work/istio"
	go run ./testdata/devcerts -out "$work/istio/etc/certs"
	istio_flags=(-istio "$ISTIO_AGENT" -istio-dir "$work/istio")
else
	echo "bench-xds: $ISTIO_AGENT not found (bash ../shared/peers/istio-agent/build.sh): Istio not measured"
fi

nocache_flag=()
if [ "$NOCACHE" = 1 ]; then nocache_flag=(-nocache); fi

"$work/xdsbench" -meshagent "$work/xdsproxyd" "${istio_flags[@]}" "${nocache_flag[@]}" \
	-rounds "$ROUNDS" -small "$SMALL" -sizes "$SIZES"
