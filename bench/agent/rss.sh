#!/usr/bin/env bash
# make bench-rss: the whole agent's resident memory, beside Istio's own
# pilot-agent measured in the same run, the same way.
#
# Each agent runs in a temp dir with file-mounted dev certificates, the
# stand-in Envoy (testdata/fakeenvoy) and its status server, on free ports.
#   idle: IDLE seconds after it is ready (default 125: past the Go runtime's
#         forced GC at 2 minutes, so the figure is the steady state rather
#         than a moment after start-up), with a readiness probe every second
#         (kubelet's) and two Prometheus scrapes, as in a pod; then VmRSS.
#   DNS load (meshagent only: pilot-agent's DNS proxy serves nothing without
#         an NDS table from a control plane): dnsperf for LOAD seconds, local
#         names and forwarded ones, VmRSS sampled every 0.2 s, the largest
#         sample reported (VmHWM would report the start-up peak).
# RSS is split as the kernel counts it: anon (the process's own memory; what
# Kubernetes calls container_memory_rss) and file (pages of the executable
# mapped in; clean, shared with every process mapping the same file, and
# reclaimable).
#
# The DNS proxy forwards only to a dnsmasq started here on a loopback address
# (port 53: resolv.conf cannot name a port, so this needs root), never to the
# machine's resolver. pilot-agent runs under `unshare -m` with a resolv.conf
# naming that dnsmasq bind-mounted over /etc/resolv.conf, and its DNS capture
# off. pilot-agent comes from $PILOT_AGENT (default
# ~/.cache/meshagent-peers/pilot-agent, built by
# /work/shared/peers/istio-agent/build.sh); without it that column is skipped.
# meshagent is built as Istio builds its agent (common/scripts/gobuild.sh:
# CGO_ENABLED=0, a static binary); build.sh builds pilot-agent with cgo, which
# maps libc too (~2 MiB of file RSS): CGO_ENABLED=0 build.sh OUT gives the
# like-for-like peer.
# BASELINE_BIN=path measures another meshagent build (say, of the previous
# commit) in the same run, for before/after ratios.
set -euo pipefail

IDLE=${IDLE:-125}
LOAD=${LOAD:-10}
HOSTS=${HOSTS:-1000}
PILOT_AGENT=${PILOT_AGENT:-$HOME/.cache/meshagent-peers/pilot-agent}
cd "$(dirname "$0")/../.."

. bench/lib.sh
require bench-rss "apt-get install -y dnsperf dnsmasq dnsutils curl util-linux" dnsperf dnsmasq dig curl go unshare python3
require_root bench-rss "dnsmasq on port 53 of a loopback address, unshare -m"
start_work

mkdir "$work/bin"
CGO_ENABLED=0 go build -o "$work/bin/meshagent" ./cmd/meshagent
go build -o "$work/bin/fakeenvoy" ./testdata/fakeenvoy
go build -o "$work/bin/controlplane" ./bench/agent/controlplane
# The control plane both agents' Envoys get their configuration from
# (plaintext ADS): with it both turn ready, as in a pod.
"$work/bin/controlplane" -namespace ns0 >"$work/controlplane.addr" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/controlplane.addr" ] && break; sleep 0.05; done
xds=$(cat "$work/controlplane.addr")
go run ./testdata/devcerts -out "$work/certs" >/dev/null

# The mesh names, for the agent's name table and the upstream's hosts file.
mkdir "$work/table"
up=$(bench_upstream)
mesh_table "$HOSTS" >"$work/table/table.json"
for ((i = 0; i < HOSTS; i++)); do echo "$(mesh_name "$i") A"; echo "name$i.upstream.test A"; done >"$work/queries.txt"
pod_resolv_conf "$up" >"$work/resolv.conf"

dnsmasq -k --conf-file=/dev/null --no-resolv --no-hosts --port=53 --listen-address="$up" --bind-interfaces \
	--pid-file= --user=root --address=/upstream.test/192.0.2.77 --log-facility="$work/dnsmasq.log" &
pids+=($!)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
kib() { awk -v k="$1" '/^(VmRSS|RssAnon|RssFile):/ {v[$1] = $2} END {print v[k ":"]}' "/proc/$2/status"; }
mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }

# wait_ready PORT PID: until GET /healthz/ready on PORT answers 200 (both
# agents' Envoys have their configuration from the control plane).
wait_ready() {
	for _ in $(seq 300); do
		if curl -sf "http://127.0.0.1:$1/healthz/ready" >/dev/null; then return 0; fi
		if ! kill -0 "$2" 2>/dev/null; then break; fi
		sleep 0.1
	done
	echo "bench-rss: the agent on status port $1 never became ready" >&2
	return 1
}

# idle NAME STATUSPORT PID: sit IDLE seconds as a pod does, print the figures.
declare -A RSS ANON FILE
idle() {
	local name=$1 port=$2 pid=$3
	for ((s = 0; s < IDLE; s++)); do
		curl -s -o /dev/null "http://127.0.0.1:$port/healthz/ready" || true
		if [ $s -eq 1 ] || [ $s -eq $((IDLE / 2)) ]; then curl -s -o /dev/null "http://127.0.0.1:$port/stats/prometheus" || true; fi
		sleep 1
	done
	RSS[$name]=$(kib VmRSS "$pid")
	ANON[$name]=$(kib RssAnon "$pid")
	FILE[$name]=$(kib RssFile "$pid")
}

# meshagent NAME BIN: start a meshagent, measure idle then under DNS load.
meshagent() {
	local name=$1 bin=$2 dir="$work/$1"
	mkdir -p "$dir/root/etc"
	cp -r "$work/certs" "$dir/root/etc/certs"
	local status admin dns
	status=$(free_port) admin=$(free_port) dns=$(free_port)
	env PROXY_CONFIG="{\"discoveryAddress\":\"$xds\",\"controlPlaneAuthPolicy\":\"NONE\",\"statusPort\":$status,\"proxyAdminPort\":$admin,\"binaryPath\":\"$work/bin/fakeenvoy\"}" \
		ENVOY_STATUS_PORT="$(free_port)" ENVOY_PROMETHEUS_PORT="$(free_port)" DNS_PROXY_ADDR="127.0.0.1:$dns" \
		POD_NAME=bench-0 POD_NAMESPACE=ns0 INSTANCE_IP=127.0.0.1 SERVICE_ACCOUNT=default \
		"$bin" proxy --root "$dir/root" --name-table "$work/table/table.json" --resolv-conf "$work/resolv.conf" \
		>"$dir/agent.log" 2>&1 &
	local pid=$!
	pids+=("$pid")
	wait_ready "$status" "$pid" || { tail -20 "$dir/agent.log" >&2; exit 1; }
	idle "$name" "$status" "$pid"

	dnsperf -s 127.0.0.1 -p "$dns" -d "$work/queries.txt" -l "$LOAD" -c 8 -q 100 >"$dir/dnsperf.out" 2>&1 &
	local perf=$! peak=0 anon=0 file=0
	while kill -0 "$perf" 2>/dev/null; do
		local r
		r=$(kib VmRSS "$pid")
		if [ "$r" -gt "$peak" ]; then peak=$r anon=$(kib RssAnon "$pid") file=$(kib RssFile "$pid"); fi
		sleep 0.2
	done
	wait "$perf" || true
	RSS[$name-dns]=$peak ANON[$name-dns]=$anon FILE[$name-dns]=$file
	QPS[$name]=$(awk '/Queries per second:/ {printf "%.0f", $4}' "$dir/dnsperf.out")
	kill "$pid"
	wait "$pid" 2>/dev/null || true
}

# pilot_agent: Istio's agent, the same kind of run (file-mounted certs, the
# stand-in Envoy, its status server), DNS capture off.
pilot_agent() {
	local dir="$work/pilot-agent"
	mkdir -p "$dir/etc" "$dir/var/lib/istio/envoy"
	cp -r "$work/certs" "$dir/etc/certs"
	local tmpl
	tmpl=$(ls "$(go env GOMODCACHE)"/istio.io/istio@*/tools/packaging/common/envoy_bootstrap.json 2>/dev/null | head -1)
	if [ -z "$tmpl" ]; then
		echo "note: Istio's envoy_bootstrap.json is not in the module cache (run /work/shared/peers/istio-agent/build.sh): pilot-agent skipped"
		return 1
	fi
	cp "$tmpl" "$dir/var/lib/istio/envoy/envoy_bootstrap_tmpl.json"
	local status admin
	status=$(free_port) admin=$(free_port)
	(cd "$dir" && exec unshare -m sh -c 'mount --bind "$0" /etc/resolv.conf && exec "$@"' "$work/resolv.conf" \
		env FILE_MOUNTED_CERTS=true CLOUD_PLATFORM=none POD_NAME=bench-0 POD_NAMESPACE=ns0 INSTANCE_IP=127.0.0.1 \
		SERVICE_ACCOUNT=default ENVOY_STATUS_PORT="$(free_port)" ENVOY_PROMETHEUS_PORT="$(free_port)" \
		PROXY_CONFIG="{\"discoveryAddress\":\"$xds\",\"controlPlaneAuthPolicy\":\"NONE\",\"statusPort\":$status,\"proxyAdminPort\":$admin,\"binaryPath\":\"$work/bin/fakeenvoy\"}" \
		"$PILOT_AGENT" proxy sidecar) >"$dir/agent.log" 2>&1 &
	local pid=$!
	pids+=("$pid")
	wait_ready "$status" "$pid" || { tail -20 "$dir/agent.log" >&2; return 1; }
	idle pilot-agent "$status" "$pid"
	kill "$pid"
	wait "$pid" 2>/dev/null || true
}

declare -A QPS
echo "bench-rss: each agent ${IDLE}s idle (a readiness probe a second, 2 scrapes), then meshagent under dnsperf for ${LOAD}s ($HOSTS local + $HOSTS forwarded names)..."
meshagent meshagent "$work/bin/meshagent"
if [ -n "${BASELINE_BIN:-}" ]; then meshagent baseline "$BASELINE_BIN"; fi
have_pilot=0
if [ -x "$PILOT_AGENT" ]; then
	pilot_agent && have_pilot=1
else
	echo "note: no pilot-agent at $PILOT_AGENT (/work/shared/peers/istio-agent/build.sh builds it): its column is skipped"
fi

echo
line() { printf '%-34s %8s MiB   (anon %5s, file %5s)%s\n' "$1" "$(mib "${RSS[$2]}")" "$(mib "${ANON[$2]}")" "$(mib "${FILE[$2]}")" "${3:-}"; }
line "meshagent idle RSS" meshagent
line "meshagent RSS under DNS load" meshagent-dns "   ${QPS[meshagent]} QPS"
if [ -n "${BASELINE_BIN:-}" ]; then
	line "baseline idle RSS" baseline
	line "baseline RSS under DNS load" baseline-dns "   ${QPS[baseline]} QPS"
fi
[ $have_pilot = 1 ] && line "pilot-agent idle RSS" pilot-agent
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "n/a"}'; }
echo "ratios:"
if [ $have_pilot = 1 ]; then
	echo "  meshagent idle / pilot-agent idle           = $(ratio "${RSS[meshagent]}" "${RSS[pilot-agent]}") (anon $(ratio "${ANON[meshagent]}" "${ANON[pilot-agent]}"))"
	echo "  meshagent under DNS load / pilot-agent idle = $(ratio "${RSS[meshagent-dns]}" "${RSS[pilot-agent]}")"
fi
if [ -n "${BASELINE_BIN:-}" ]; then
	echo "  meshagent idle / baseline idle              = $(ratio "${RSS[meshagent]}" "${RSS[baseline]}") (anon $(ratio "${ANON[meshagent]}" "${ANON[baseline]}"))"
	echo "  meshagent DNS load / baseline DNS load      = $(ratio "${RSS[meshagent-dns]}" "${RSS[baseline-dns]}")"
	echo "  meshagent DNS QPS / baseline DNS QPS        = $(ratio "${QPS[meshagent]}" "${QPS[baseline]}")"
fi
