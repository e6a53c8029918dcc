#!/usr/bin/env bash
# make bench-dns: meshagent's DNS proxy under dnsperf, against the upstream
# resolver queried directly (the floor) and CoreDNS (hosts plugin for the
# mesh names, forward plugin to the same upstream for the rest) in the same
# run. CoreDNS comes from PATH, else from $BENCH_BIN (default
# ~/.cache/meshagent-bench/bin), else it is built there once with
# `go install github.com/coredns/coredns@$COREDNS_VERSION` (a few minutes
# on 2 cores; NO_COREDNS=1 skips it). Two runs per target, each bounded by
# DURATION seconds, repeated ROUNDS times (medians reported):
#   throughput: as fast as dnsperf goes with 100 queries outstanding (QPS);
#   latency:    a fixed load of RATE queries/s (mean and p99 latency).
# Prints QPS, mean and p99 latency, peak RSS (VmHWM) and ratios.
# Needs root (the upstream dnsmasq binds port 53 of a loopback address, as
# resolv.conf cannot name a port), dnsmasq and dnsperf (apt packages).
set -euo pipefail

DURATION=${DURATION:-4}
ROUNDS=${ROUNDS:-3}
RATE=${RATE:-10000}
HOSTS=${HOSTS:-1000}
cd "$(dirname "$0")/../.."

. bench/lib.sh
require bench-dns "apt-get install -y dnsperf dnsmasq" dnsperf dnsmasq go
require_root bench-dns "dnsmasq on port 53 of a loopback address"
start_work

go build -o "$work/dnsproxyd" ./bench/dns/dnsproxyd

# The table file sits in a directory of its own: the proxy watches its
# directory, and dnsperf's outputs in $work would wake it for nothing.
mkdir "$work/table"

# The mesh: HOSTS Kubernetes services over 10 namespaces; the same names in
# a hosts file for the upstream and CoreDNS, so that each can answer them.
up=$(bench_upstream)
mesh_table "$HOSTS" >"$work/table/table.json"
for ((i = 0; i < HOSTS; i++)); do echo "$(mesh_ip "$i") $(mesh_name "$i")"; done >"$work/hosts"
for ((i = 0; i < HOSTS; i++)); do echo "$(mesh_name "$i") A"; done >"$work/local.txt"
for ((i = 0; i < HOSTS; i++)); do echo "name$i.upstream.test A"; done >"$work/forwarded.txt"
pod_resolv_conf "$up" >"$work/resolv.conf"

# Upstream: dnsmasq, answering *.upstream.test itself and forwarding nothing.
dnsmasq -k --conf-file=/dev/null --no-resolv --no-hosts --addn-hosts="$work/hosts" --port=53 \
	--listen-address="$up" --bind-interfaces --pid-file= --user=root \
	--address=/upstream.test/192.0.2.77 --log-facility="$work/dnsmasq.log" &
dnsmasq_pid=$!
pids+=("$dnsmasq_pid")

port=$((20000 + RANDOM % 20000))
# PROFILE_DIR=dir: the proxy writes cpu.pprof and allocs.pprof there (go
# tool pprof), covering the whole run.
profile_flags=()
if [ -n "${PROFILE_DIR:-}" ]; then
	mkdir -p "$PROFILE_DIR"
	profile_flags=(-cpuprofile "$PROFILE_DIR/cpu.pprof" -memprofile "$PROFILE_DIR/allocs.pprof")
	cp "$work/dnsproxyd" "$PROFILE_DIR/dnsproxyd"
fi
"$work/dnsproxyd" -listen "127.0.0.1:$port" -resolv-conf "$work/resolv.conf" -table "$work/table/table.json" \
	-namespace ns0 "${profile_flags[@]}" 2>"$work/dnsproxyd.log" &
proxy_pid=$!
pids+=("$proxy_pid")

wait_answer() { # server port name
	for _ in $(seq 100); do
		if dig +short +time=1 +tries=1 @"$1" -p "$2" "$3" 2>/dev/null | grep -q .; then return 0; fi
		sleep 0.1
	done
	echo "bench-dns: $1:$2 never answered $3" >&2
	cat "$work"/*.log >&2
	exit 1
}
wait_answer "$up" 53 svc0.ns0.svc.cluster.local
wait_answer 127.0.0.1 "$port" svc0.ns0.svc.cluster.local
wait_answer 127.0.0.1 "$port" x.upstream.test

# BASELINE_BIN=path: another dnsproxyd build (say, of the previous commit)
# measured in the same run as "baseline", for before/after ratios.
baseline_pid=""
baseline_port=$((port + 2))
if [ -n "${BASELINE_BIN:-}" ]; then
	"$BASELINE_BIN" -listen "127.0.0.1:$baseline_port" -resolv-conf "$work/resolv.conf" -table "$work/table/table.json" \
		-namespace ns0 2>"$work/baseline.log" &
	baseline_pid=$!
	pids+=("$baseline_pid")
	wait_answer 127.0.0.1 "$baseline_port" svc0.ns0.svc.cluster.local
	wait_answer 127.0.0.1 "$baseline_port" x.upstream.test
fi

# CoreDNS: PATH, the bench cache, or built into the bench cache (not the
# repository) from the Go module proxy.
COREDNS_VERSION=${COREDNS_VERSION:-v1.12.1}
BENCH_BIN=${BENCH_BIN:-$HOME/.cache/meshagent-bench/bin}
coredns_bin=""
if [ "${NO_COREDNS:-0}" = 1 ]; then
	echo "note: NO_COREDNS=1: CoreDNS column skipped"
elif command -v coredns >/dev/null; then
	coredns_bin=$(command -v coredns)
elif [ -x "$BENCH_BIN/coredns" ]; then
	coredns_bin=$BENCH_BIN/coredns
else
	echo "bench-dns: no coredns on PATH (Debian has no package): go install github.com/coredns/coredns@$COREDNS_VERSION into $BENCH_BIN (once; several minutes)..."
	mkdir -p "$BENCH_BIN"
	if (cd /tmp && GOBIN="$BENCH_BIN" timeout 1800 go install "github.com/coredns/coredns@$COREDNS_VERSION") >"$work/coredns-install.log" 2>&1; then
		coredns_bin=$BENCH_BIN/coredns
	else
		echo "bench-dns: go install of CoreDNS failed; going on without it. Why:"
		tail -5 "$work/coredns-install.log" | sed 's/^/  /'
	fi
fi
if [ -n "$coredns_bin" ]; then echo "CoreDNS: $coredns_bin ($("$coredns_bin" -version 2>/dev/null | head -1))"; fi

coredns_pid=""
coredns_port=$((port + 1))
if [ -n "$coredns_bin" ]; then
	# The same job as the proxy: the mesh names from a hosts file (the
	# hosts plugin), everything else forwarded to the same upstream (the
	# forward plugin). No cache plugin: the proxy caches nothing either.
	cat >"$work/Corefile" <<EOC
.:$coredns_port {
    bind 127.0.0.1
    hosts $work/hosts {
        ttl 30
        fallthrough
    }
    forward . $up
    errors
}
EOC
	"$coredns_bin" -conf "$work/Corefile" >"$work/coredns.log" 2>&1 &
	coredns_pid=$!
	pids+=("$coredns_pid")
	wait_answer 127.0.0.1 "$coredns_port" svc0.ns0.svc.cluster.local
	wait_answer 127.0.0.1 "$coredns_port" x.upstream.test
fi

declare -A QPS MEAN P99 QPSALL P99ALL MEANALL
# perf NAME SERVER PORT FILE: one round; the values of every round are kept.
perf() {
	local name=$1 server=$2 p=$3 file=$4
	local out="$work/$name"
	dnsperf -s "$server" -p "$p" -d "$file" -l "$DURATION" -c 8 -q 100 >"$out.tput" 2>&1
	QPSALL[$name]+=" $(awk '/Queries per second:/ {printf "%.0f", $4}' "$out.tput")"
	local lost
	lost=$(awk '/Queries lost:/ {print $3}' "$out.tput")
	dnsperf -s "$server" -p "$p" -d "$file" -l "$DURATION" -c 8 -Q "$RATE" -v >"$out.lat" 2>&1
	# "> NOERROR name A 0.000123": latency in seconds, 5th field.
	awk '/^> / {print $5}' "$out.lat" | sort -g >"$out.sorted"
	local n
	n=$(wc -l <"$out.sorted")
	MEANALL[$name]+=" $(awk '{s += $1} END {if (NR) printf "%.1f", s / NR * 1e6}' "$out.sorted")"
	P99ALL[$name]+=" $(awk -v k=$(((n * 99 + 99) / 100)) 'NR == k {printf "%.1f", $1 * 1e6}' "$out.sorted")"
	if [ "${lost:-0}" != 0 ]; then echo "  ($name: $lost queries lost in the throughput run)"; fi
}
median() { printf '%s\n' $1 | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
spread() { printf '%s\n' $1 | sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {print lo "-" hi}'; }

hwm() { awk '/VmHWM/ {print $2}' "/proc/$1/status"; }

# Targets take turns, round after round, so that a slow moment of the
# machine (2 cores for dnsperf, the servers and the rest) falls on all.
targets=(upstream-local upstream-forwarded proxy-local proxy-forwarded)
declare -A SERVER=([upstream]="$up 53" [proxy]="127.0.0.1 $port")
if [ -n "$coredns_pid" ]; then
	targets+=(coredns-local coredns-forwarded)
	SERVER[coredns]="127.0.0.1 $coredns_port"
fi
if [ -n "$baseline_pid" ]; then
	targets+=(baseline-local baseline-forwarded)
	SERVER[baseline]="127.0.0.1 $baseline_port"
fi
echo "running dnsperf: $ROUNDS rounds of ${DURATION}s throughput + ${DURATION}s at ${RATE} qps per target, $HOSTS names..."
for ((r = 1; r <= ROUNDS; r++)); do
	for t in "${targets[@]}"; do
		# shellcheck disable=SC2086 # SERVER holds "host port"
		perf "$t" ${SERVER[${t%%-*}]} "$work/${t#*-}.txt"
	done
done
for t in "${targets[@]}"; do
	QPS[$t]=$(median "${QPSALL[$t]}")
	MEAN[$t]=$(median "${MEANALL[$t]}")
	P99[$t]=$(median "${P99ALL[$t]}")
done

declare -A RSS
RSS[upstream]=$(hwm "$dnsmasq_pid")
RSS[proxy]=$(hwm "$proxy_pid")
[ -n "$coredns_pid" ] && RSS[coredns]=$(hwm "$coredns_pid")
[ -n "$baseline_pid" ] && RSS[baseline]=$(hwm "$baseline_pid")

echo
printf '%-20s %8s %16s %9s %9s %18s %13s\n' target QPS "(QPS range)" "mean(us)" "p99(us)" "(p99 range)" "peakRSS(KiB)"
for t in "${targets[@]}"; do
	printf '%-20s %8s %16s %9s %9s %18s %13s\n' "$t" "${QPS[$t]}" "($(spread "${QPSALL[$t]}"))" "${MEAN[$t]}" \
		"${P99[$t]}" "($(spread "${P99ALL[$t]}"))" "${RSS[${t%%-*}]}"
done
echo "(medians of $ROUNDS rounds, ranges in brackets)"
echo "(upstream = dnsmasq queried directly, answering the same names from a hosts file: the floor;"
echo " latency at a fixed ${RATE} qps; QPS with 100 queries outstanding; peak RSS over the whole run)"
echo
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "n/a"}'; }
echo "ratios:"
echo "  proxy-local QPS / upstream-local QPS         = $(ratio "${QPS[proxy-local]}" "${QPS[upstream-local]}")"
echo "  proxy-forwarded QPS / upstream-forwarded QPS = $(ratio "${QPS[proxy-forwarded]}" "${QPS[upstream-forwarded]}")"
echo "  proxy-local p99 / upstream-local p99         = $(ratio "${P99[proxy-local]}" "${P99[upstream-local]}")"
echo "  proxy-forwarded p99 / upstream-forwarded p99 = $(ratio "${P99[proxy-forwarded]}" "${P99[upstream-forwarded]}")"
# The proxy against each other server measured (its RSS too).
for other in coredns baseline; do
	[ -n "${SERVER[$other]:-}" ] || continue
	for kind in local forwarded; do
		printf '  %-44s = %s\n' "proxy-$kind QPS / $other-$kind QPS" "$(ratio "${QPS[proxy-$kind]}" "${QPS[$other-$kind]}")"
	done
	for kind in local forwarded; do
		printf '  %-44s = %s\n' "proxy-$kind p99 / $other-$kind p99" "$(ratio "${P99[proxy-$kind]}" "${P99[$other-$kind]}")"
	done
	printf '  %-44s = %s\n' "proxy peak RSS / $other peak RSS" "$(ratio "${RSS[proxy]}" "${RSS[$other]}")"
done
