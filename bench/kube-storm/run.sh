#!/usr/bin/env bash
# make bench-kube-storm: the start and reconnect storms on the kube node
# (#36). STORM_PODS pods (default 30), native sidecars injected by Istio's
# webhook, certificates from istiod's CA, the image already on the node
# (IfNotPresent), after one unmeasured pod of each agent (a warm istiod),
# created at once, once with Istio's
# agent and once with meshagent, in one run (TestKubeStorm in
# cmd/meshagent/e2e/kube/storm_test.go, which brings the node, the registry
# and Istio up, and always down): per pod created → Ready p50/p95/max, the
# CSRs istiod's CA counted, the sum of the istio-proxy containers' working
# sets (the kubelet's resource metrics), delete → all gone, restarts, timeouts
# in the sidecars' logs; then istiod stopped for 5 s and started again with
# the pods connected: time until istiod's syncz lists every pod synced, the
# spread of those times, pods leaving Ready meanwhile. A table per round,
# ours / Istio's / ratio: STORM_ROUNDS rounds (default 2), the order turned
# each round (Istio's agent first in the first; STORM_FIRST=meshagent swaps
# it), and the p95 ratios with their geometric mean: the second storm of a
# round meets a warmer node. STORM_PROXY_CONFIG: a ProxyConfig (JSON) for
# every pod of both agents, e.g. '{"proxyMetadata":{"ECC_SIGNATURE_ALGORITHM":"ECDSA"}}'.
# STORM_FLOOR (default 1; 0 leaves it out): a third start storm each round,
# with a sidecar that costs nothing (testdata/floorproxy: no capture, key,
# Envoy or xDS): the p95 no agent can beat on this node, beside the two
# agents'.
# Pod 0 of each storm logs at debug; every sidecar's log is kept in
# .tmp/kube-storm-logs (MESHAGENT_KUBE_LOGS=1 keeps the node's and istiod's
# in .tmp/kube-logs). Root; costs the whole machine for about 6 minutes
# with two rounds (3.5 with one).
set -euo pipefail
cd "$(dirname "$0")/../.."
. bench/lib.sh
require_root bench-kube-storm "the kube node: a network namespace, cgroups and mounts"
mkdir -p .tmp
log=.tmp/kube-storm.log
rc=0
# The STORM_* settings pass through as they are: their defaults are the
# test's (TestKubeStorm reads each once).
MESHAGENT_KUBE_STORM=1 go test -count=1 -timeout 60m -run '^TestKubeStorm$' -v \
  ./cmd/meshagent/e2e/kube >"$log" 2>&1 || rc=$?
# The tables (the test logs each indented), and any failure.
sed -n '/storm table/,/^ \{0,4\}[^ ]/p' "$log" | sed 's/^        //' | grep -v '^--- \|^=== \|^PASS\|^FAIL\|^ok\|^ *storm_test.go:' || true
grep -E '^\s+storm_test.go:[0-9]+: .*(pods Ready|all gone|synced at|storm rounds|storm floor)|--- FAIL|^(FAIL|ok)' "$log" | sed 's/^ *//' || true
[ "$rc" -eq 0 ] || echo "details: $log"
exit "$rc"
