#!/usr/bin/env bash
# make bench-vs-istio: the product against Istio's agent (#24). The shipped
# binary (`make build`'s bin/meshagent, run as `meshagent proxy sidecar`)
# and Istio's pilot-agent, the same inputs, the same harness, interleaved
# (A, B, A, B... with the order rotated each round), in one run; ONE table
# of figure | meshagent | Istio's agent | ratio, each a median with its
# spread, and the load average while it ran (the machine is shared: only
# the ratios mean anything).
#
#  1. Start → ready, warm page cache: exec to the first 200 of
#     /healthz/ready, with the stand-in Envoy (testdata/fakeenvoy) taking
#     its configuration from a plaintext control plane (bench/agent/
#     controlplane) and file-mounted dev certs; START_ROUNDS starts each.
#  2. Memory and CPU at idle, as Kubernetes counts them: each agent in a
#     cgroup v1 memory cgroup of its own (limit 512M) and its stand-in Envoy
#     in another (the two are the istio-proxy container; the agent's own is
#     the agent alone, #36), started from a fresh copy of its binary whose
#     page cache was dropped first (a node that has not run the image yet:
#     the pages the agent reads are charged to its cgroup, as a pod's are),
#     IDLE seconds idle with a readiness probe a second and a Prometheus
#     scrape every 15 s (the kubelet's and Prometheus's defaults; the probe
#     as the kubelet sends it, to the stand-in Envoy's 15021 listener
#     (ENVOY_STATUS_PORT), which forwards it to the agent over a pooled
#     connection as Envoy does (Istio's bootstrap; ours answers it in Envoy
#     while the agent has said it is ready, #36: the container's CPU is
#     shown beside the agent's), and the scrape with Prometheus 3's headers:
#     Accept preferring OpenMetrics, gzip, the scrape timeout; the probe
#     order turned every second; #36); then each
#     cgroup's working set as the kubelet computes it
#     (memory.usage_in_bytes − total_inactive_file), its anon (total_rss)
#     and page cache (total_cache), the agent process's
#     VmRSS/RssAnon/RssFile, and the agent's CPU time across the idle window
#     (cpuacct.usage of a cpuacct cgroup of its own, the stand-in in
#     another), scaled to seconds per hour. Then IDLE_DIRECT (IDLE) more
#     seconds idle probed as before #36, for comparison: curl to the agent's
#     status port on a new connection each time (the path of a rewritten
#     application probe, /app-health/..., which the kubelet sends to 15020
#     directly), the scrape curl's bare GET; CPU only. MEM_ROUNDS rounds. (It also ran meshagent with its start-up code pages
#     kept mapped; that showed the unmapping doubled the working set after an
#     exec, and the agent no longer unmaps them: #24, docs/performance.md.)
#     Then the binary is run once more in the cgroup (`BIN version`, as a
#     `kubectl exec ... pilot-agent request` or a preStop hook runs it) and
#     the working set read again: a file page whose mapping is torn down
#     while young is marked accessed, the second time it is activated, and
#     active file pages count in the working set.
#     Beside the two agents, in the same windows and cgroups, runs the
#     floor (MEM_FLOOR=0 leaves it out; bench/vs-istio/floor): a Go program
#     that does only what the idle window asks of an agent with the
#     libraries both agents use (Envoy as its child, the ADS stream proxied
#     to the control plane, SDS served, readiness and the merged scrape on
#     its status port): what any Go agent costs at idle before it does
#     anything else, as the start storm's floor is (#36). And the floor
#     again with every package meshagent links imported (blank imports
#     added at build time, an overlay: nothing is written to the tree), so
#     the table splits the agent's idle memory into the floor, what its
#     packages hold once initialised, and what its services hold.
#     MEM_STATS_PEERS=N (default 0) has the stand-in Envoy expose Istio's
#     request families for N peers (FAKE_ENVOY_STATS_PEERS, ~60 kB a
#     peer): the scrape of a sidecar with traffic, not an idle one's
#     26 kB (#36).
#     MEM_APP_BYTES=N (default 0) gives both agents an application whose
#     /metrics is a text exposition of ~N bytes (bench/vs-istio/app.py, a
#     JVM service's request histogram), merged into every scrape
#     (ISTIO_PROMETHEUS_ANNOTATIONS). The floor scrapes no application, so
#     it is left out then (#36).
#  3. xDS through the whole agent (bench/xds/xdsbench -agent): DISABLE_ENVOY,
#     plaintext upstream, the client playing Envoy; CDS pushes of SIZES
#     clusters, SotW and Delta, recv time via the agent / direct (median of
#     XDS_ROUNDS, quartiles), small-update added latency, peak RSS (VmHWM);
#     each agent in a memory cgroup of its own, from a fresh copy of its
#     binary, and sampled every 5 ms across the pushes: its peak anon
#     (RssAnon) and the cgroup's peak working set, each beside its value
#     before the pushes; meshagent as shipped (GOGC=50) and with GOGC=100
#     and GOGC=100 + GOMEMLIMIT.
#  4. Start and reconnect against Istio's istiod (PHASES=istiod, not in the
#     default set: it needs the istiod peer, `make e2e-istiod`): the Go test
#     TestIstiodStartReconnectBench (cmd/meshagent/e2e/istiod_bench_test.go)
#     runs the shipped binary and Istio's agent on the same istiod, in a
#     network namespace of its own, ISTIOD_ROUNDS rounds, the order rotated
#     each round: start → /healthz/ready 200, and istiod killed, 2 s down,
#     started again → istiod's syncz lists the proxy (from istiod's start,
#     and from its ports open). Each round's ratio is printed under the table.
#  5, 6. DNS and a large name table (PHASES=dns, names): below, where they
#     run. Elsewhere both agents run with ISTIO_META_DNS_CAPTURE=false
#     (Istio's default), so nothing is forwarded anywhere. Every port is on
#     loopback; the DNS proxies forward only to the dnsmasq this script
#     starts on a loopback address.
set -euo pipefail

# PHASES: which of start, mem, xds, dns, names, istiod to run.
PHASES=${PHASES:-start mem xds dns names}
ISTIOD_ROUNDS=${ISTIOD_ROUNDS:-5}
IDLE=${IDLE:-150} # past the Go runtime's 2-minute forced GC: part of the idle cost
IDLE_DIRECT=${IDLE_DIRECT:-$IDLE}
MEM_ROUNDS=${MEM_ROUNDS:-2}
MEM_FLOOR=${MEM_FLOOR:-1}
export MEM_STATS_PEERS=${MEM_STATS_PEERS:-0} MEM_APP_BYTES=${MEM_APP_BYTES:-0}
START_ROUNDS=${START_ROUNDS:-10}
XDS_ROUNDS=${XDS_ROUNDS:-15}
# XDS_SETTLE=S (default 0: not): the xDS phase also samples each agent's
# memory S seconds after a size's pushes, its client still connected: what
# an agent keeps of a mesh's configuration (ours its last-known-good copy).
export XDS_SETTLE=${XDS_SETTLE:-0}
SMALL=${SMALL:-200}
SIZES=${SIZES:-1000,10000}
MEMLIMIT=${MEMLIMIT:-40MiB}
PILOT_AGENT=${PILOT_AGENT:-$HOME/.cache/meshagent-peers/pilot-agent}
cd "$(dirname "$0")/../.."
repo=$PWD

. bench/lib.sh
require bench-vs-istio "apt-get install -y curl python3" curl go python3
require_root bench-vs-istio "cgroup v1 memory cgroups, dropping a file's page cache"
if [ ! -x "$PILOT_AGENT" ]; then
	echo "bench-vs-istio: no pilot-agent at $PILOT_AGENT (make peer-istio-agent): skipped"
	exit 0
fi
cgroot=/sys/fs/cgroup/memory
[ -w "$cgroot" ] || { echo "bench-vs-istio: no cgroup v1 memory hierarchy at $cgroot: skipped"; exit 0; }
cpuroot=/sys/fs/cgroup/cpuacct
[ -w "$cpuroot" ] || { echo "bench-vs-istio: no cgroup v1 cpuacct hierarchy at $cpuroot: skipped"; exit 0; }
tmpl=$(ls "$(go env GOMODCACHE)"/istio.io/istio@*/tools/packaging/common/envoy_bootstrap.json 2>/dev/null | head -1)
[ -n "$tmpl" ] || { echo "bench-vs-istio: Istio's envoy_bootstrap.json is not in the module cache (make peer-istio-agent): skipped"; exit 0; }

# On disk (not tmpfs): a copy's page cache can be dropped and re-read.
work=$(mktemp -d /var/tmp/vs-istio.XXXXXX)
pids=()
cgroups=()
cleanup() {
	# Agents lead process groups of their own (setsid); the rest do not.
	for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	for cg in "${cgroups[@]}"; do
		[ -d "$cg" ] || continue
		# Any straggler goes back to the root cgroup, so the directory can go.
		while read -r p; do echo "$p" >"${cg%/*}/cgroup.procs" 2>/dev/null || true; done <"$cg/cgroup.procs"
		rmdir "$cg" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

loads=()
sample_load() { loads+=("$(cut -d' ' -f1 /proc/loadavg)"); }
sample_load

echo "bench-vs-istio: building..." >&2
make -s build >/dev/null
mkdir "$work/bin"
cp bin/meshagent "$work/bin/meshagent"
CGO_ENABLED=0 go build -o "$work/bin/fakeenvoy" ./testdata/fakeenvoy
go build -o "$work/bin/controlplane" ./bench/agent/controlplane
go build -o "$work/bin/xdsbench" ./bench/xds/xdsbench
# The floors are built as the agent is (its build tags, read from the
# binary make build made; no cgo), for the memory phase only.
tags=$(go version -m "$work/bin/meshagent" | awk '$1 == "build" && $2 ~ /^-tags=/ {sub(/^-tags=/, "", $2); print $2}')
case " $PHASES " in *" mem "*) [ "$MEM_FLOOR" = 0 ] || {
	CGO_ENABLED=0 go build -tags "$tags" -o "$work/bin/floor" ./bench/vs-istio/floor
	# The floor with meshagent's packages: one file of blank imports of every
	# package of this module the agent links (internal ones come with their
	# importers), laid over the floor's directory.
	{
		printf 'package main\n\nimport (\n'
		go list -tags "$tags" -deps ./cmd/meshagent | grep "^github.com/meshagent/meshagent/" | grep -v -e "/internal" -e "^github.com/meshagent/meshagent/cmd/meshagent$" | sed 's/.*/\t_ "&"/'
		printf ')\n'
	} >"$work/floor-links.go"
	printf '{"Replace": {"%s": "%s"}}\n' "$repo/bench/vs-istio/floor/links.go" "$work/floor-links.go" >"$work/floor-links.json"
	CGO_ENABLED=0 go build -tags "$tags" -overlay "$work/floor-links.json" -o "$work/bin/floorlinks" ./bench/vs-istio/floor
} ;; esac
go run ./testdata/devcerts -out "$work/certs" >/dev/null
cp "$PILOT_AGENT" "$work/bin/pilot-agent"

"$work/bin/controlplane" -namespace ns0 >"$work/controlplane.addr" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/controlplane.addr" ] && break; sleep 0.05; done
xds=$(cat "$work/controlplane.addr")

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
now_ms() { date +%s%3N; }

# evict FILE...: drop the files' pages from the page cache.
evict() {
	python3 - "$@" <<-'EOF'
		import os, sys
		for p in sys.argv[1:]:
		    fd = os.open(p, os.O_RDONLY)
		    os.fsync(fd)
		    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
		    os.close(fd)
	EOF
}

# launch VARIANT DIR CGROUP: start the agent of VARIANT (meshagent,
# istio) in DIR, in its own process group (and CGROUP unless
# empty); its pid in $agent_pid, its status port in $status_port, its
# stand-in Envoy's readiness listener (Istio's 15021) in $envoy_status_port.
# envoy_cgroups (cgroup directories) are where its stand-in Envoy runs
# instead of beside it: the agent runs a wrapper that joins them and
# execs the stand-in (the same process, pid and signals).
# launch_env (VAR=value...) overrides the environment of both;
# meshagent_args are more flags for meshagent; istio_wrap is a command
# Istio's agent runs under (the DNS phases: a mount namespace whose
# /etc/resolv.conf names the bench's resolver).
launch_env=() meshagent_args=() istio_wrap=() agent_cgroups=() envoy_cgroups=()
launch() {
	local variant=$1 dir=$2 cg=$3
	mkdir -p "$dir/root/etc" "$dir/root/var/lib/istio/envoy" "$dir/bin"
	[ -d "$dir/root/etc/certs" ] || cp -r "$work/certs" "$dir/root/etc/certs"
	cp "$tmpl" "$dir/root/var/lib/istio/envoy/envoy_bootstrap_tmpl.json"
	status_port=$(free_port) envoy_status_port=$(free_port)
	local admin bin args=() env=() envoy=$dir/bin/fakeenvoy c
	admin=$(free_port)
	if [ ${#envoy_cgroups[@]} -gt 0 ]; then
		envoy=$dir/bin/envoy-in-cgroup
		{
			echo '#!/bin/sh'
			for c in "${envoy_cgroups[@]}"; do echo "echo \$\$ >$c/cgroup.procs"; done
			echo "exec $dir/bin/fakeenvoy \"\$@\""
		} >"$envoy"
		chmod +x "$envoy"
	fi
	case $variant in
	istio) bin=$dir/bin/pilot-agent env=("${istio_wrap[@]}") ;;
	floor*) bin=$dir/bin/$variant ;;
	*) bin=$dir/bin/meshagent args=(--root "$dir/root" "${meshagent_args[@]}") ;;
	esac
	local join=":"
	[ -n "$cg" ] && join="echo \$\$ >$cg/cgroup.procs"
	for c in "${agent_cgroups[@]}"; do join="$join && echo \$\$ >$c/cgroup.procs"; done
	(cd "$dir/root" && exec setsid sh -c "$join && exec \"\$@\"" sh "${env[@]}" env \
		PROXY_CONFIG="{\"discoveryAddress\":\"$xds\",\"controlPlaneAuthPolicy\":\"NONE\",\"statusPort\":$status_port,\"proxyAdminPort\":$admin,\"binaryPath\":\"$envoy\"}" \
		ENVOY_STATUS_PORT="$envoy_status_port" ENVOY_PROMETHEUS_PORT="$(free_port)" FILE_MOUNTED_CERTS=true CLOUD_PLATFORM=none \
		POD_NAME=bench-0 POD_NAMESPACE=ns0 INSTANCE_IP=127.0.0.1 SERVICE_ACCOUNT=default \
		ISTIO_META_DNS_CAPTURE=false ISTIO_META_DNS_AUTO_ALLOCATE=false "${launch_env[@]}" \
		"$bin" proxy sidecar "${args[@]}") >"$dir/agent.log" 2>&1 &
	agent_pid=$!
	pids+=("$agent_pid")
}

# wait_ready PORT PID: poll /healthz/ready every 5 ms, bounded (30 s).
wait_ready() {
	local end=$(($(now_ms) + 30000))
	while [ "$(now_ms)" -lt $end ]; do
		if curl -sf -o /dev/null "http://127.0.0.1:$1/healthz/ready"; then return 0; fi
		kill -0 "$2" 2>/dev/null || break
		sleep 0.005
	done
	return 1
}

stop() {
	kill -KILL -- "-$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}

# results: "figure variant value" lines in $work/results.
record() { echo "$1 $2 $3" >>"$work/results"; }

variants=(meshagent istio)
# rotate R: the variants in the order of round R.
rotate() { local i n=${#variants[@]}; for ((i = 0; i < n; i++)); do echo "${variants[$(((i + $1) % n))]}"; done; }

has() { case " $PHASES " in *" $1 "*) return 0 ;; esac; return 1; }
: >"$work/results"
: >"$work/xds.tsv"
record binary-mb meshagent "$(stat -c %s "$work/bin/meshagent" | awk '{printf "%.1f", $1 / 1e6}')"
record binary-mb istio "$(stat -c %s "$work/bin/pilot-agent" | awk '{printf "%.1f", $1 / 1e6}')"

# 1. Start → ready, warm.
has start || START_ROUNDS=-1
[ "$START_ROUNDS" -lt 0 ] || echo "bench-vs-istio: start → ready, $START_ROUNDS starts each..." >&2
for v in "${variants[@]}"; do
	mkdir -p "$work/start-$v/bin"
	cp "$work/bin/fakeenvoy" "$work/start-$v/bin/"
	if [ $v = istio ]; then cp "$work/bin/pilot-agent" "$work/start-$v/bin/"; else cp "$work/bin/meshagent" "$work/start-$v/bin/"; fi
done
for ((r = 0; r <= START_ROUNDS; r++)); do
	for v in $(rotate $r); do
		t0=$(now_ms)
		launch "$v" "$work/start-$v" ""
		if ! wait_ready "$status_port" "$agent_pid"; then
			echo "bench-vs-istio: $v never became ready:" >&2
			tail -20 "$work/start-$v/agent.log" >&2
			exit 1
		fi
		t1=$(now_ms)
		stop "$agent_pid"
		if [ $r -gt 0 ]; then record start-ready-ms "$v" $((t1 - t0)); fi # round 0 warms the page cache
	done
done
sample_load

# 2. Memory and CPU in cgroups, idle.
declare -A cg_of ecg_of cpu_of pid_of port_of eport_of cpu0_of
# Prometheus 3's default scrape headers (scrape_protocols' default order;
# gzip; scrape_timeout 10 s).
prometheus_scrape=(-H 'Accept: application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1'
	-H 'Accept-Encoding: gzip' -H 'X-Prometheus-Scrape-Timeout-Seconds: 10' -H 'User-Agent: Prometheus/3.5.0')
# idle_window SECONDS PORTVAR SCRAPE...: probe each agent's /healthz/ready
# at the port in the array named PORTVAR once a second, and scrape its
# status port every 15 s with curl's arguments SCRAPE; the window's length
# in ms in $window_ms, each agent's CPU (ns) in cpu_ns_of.
declare -A cpu_ns_of ecpu_ns_of ecpu0_of
idle_window() {
	local secs=$1 s v t0
	local -n probe_port=$2
	shift 2
	for v in "${variants[@]}"; do
		cpu0_of[$v]=$(cat "${cpu_of[$v]}/cpuacct.usage")
		ecpu0_of[$v]=$(cat "${cpu_of[$v]}-envoy/cpuacct.usage")
	done
	t0=$(now_ms)
	for ((s = 0; s < secs; s++)); do
		# The order turns every second: the agent probed first after the
		# sleep pays for waking the idle machine (~100 µs a probe more
		# than the second one: two Go HTTP servers that differ only in
		# their timeouts, each first in turn, #36), and meshagent was
		# always first.
		for v in $(rotate "$s"); do
			curl -s -o /dev/null "http://127.0.0.1:${probe_port[$v]}/healthz/ready" || true
			if [ $((s % 15)) -eq 1 ]; then curl -s -o /dev/null "$@" "http://127.0.0.1:${port_of[$v]}/stats/prometheus" || true; fi
		done
		sleep 1
	done
	window_ms=$(($(now_ms) - t0))
	for v in "${variants[@]}"; do
		cpu_ns_of[$v]=$(($(cat "${cpu_of[$v]}/cpuacct.usage") - cpu0_of[$v]))
		ecpu_ns_of[$v]=$(($(cat "${cpu_of[$v]}-envoy/cpuacct.usage") - ecpu0_of[$v]))
	done
}
# per_hour NS MS: CPU nanoseconds over MS milliseconds, in seconds per hour.
per_hour() { awk -v c="$1" -v ms="$2" 'BEGIN {printf "%.2f", c / 1e9 * 3600000 / ms}'; }
cgval() { awk -v k="$2" '$1 == k {print $2}' "$1/memory.stat"; }
# ws CGROUP...: the cgroups' working set summed, bytes.
ws() {
	local c t=0
	for c in "$@"; do t=$((t + $(cat "$c/memory.usage_in_bytes") - $(cgval "$c" total_inactive_file))); done
	echo $t
}
mib() { awk -v u="$1" 'BEGIN {printf "%.1f", u / 1048576}'; }
has mem || MEM_ROUNDS=0
agents=("${variants[@]}")
if [ "$MEM_APP_BYTES" != 0 ] && [ "$MEM_ROUNDS" != 0 ]; then
	MEM_FLOOR=0 # it merges no application's metrics
	app_port=$(free_port)
	python3 bench/vs-istio/app.py "$app_port" "$MEM_APP_BYTES" &
	pids+=($!)
	for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$app_port/metrics" && break; sleep 0.05; done
	curl -sf -o /dev/null "http://127.0.0.1:$app_port/metrics" ||
		{ echo "bench-vs-istio: the application (bench/vs-istio/app.py) does not answer on 127.0.0.1:$app_port" >&2; exit 1; }
fi
[ "$MEM_FLOOR" = 0 ] || [ "$MEM_ROUNDS" = 0 ] || variants+=(floor floorlinks)
for ((r = 0; r < MEM_ROUNDS; r++)); do
	echo "bench-vs-istio: memory round $((r + 1))/$MEM_ROUNDS: ${IDLE}s idle in cgroups..." >&2
	for v in $(rotate $r); do
		dir=$work/mem-$v-$r
		mkdir -p "$dir/bin"
		cp "$work/bin/fakeenvoy" "$dir/bin/"
		case $v in
		istio) cp "$work/bin/pilot-agent" "$dir/bin/" ;;
		floor*) cp "$work/bin/$v" "$dir/bin/" ;;
		*) cp "$work/bin/meshagent" "$dir/bin/" ;;
		esac
		evict "$dir"/bin/*
		name=meshagent-bench-$$-$v-$r
		cg=$cgroot/$name ecg=$cgroot/$name-envoy cpu=$cpuroot/$name ecpu=$cpuroot/$name-envoy
		mkdir "$cg" "$ecg" "$cpu" "$ecpu"
		cgroups+=("$cg" "$ecg" "$cpu" "$ecpu")
		echo 512M >"$cg/memory.limit_in_bytes"
		echo 512M >"$ecg/memory.limit_in_bytes"
		agent_cgroups=("$cpu") envoy_cgroups=("$ecg" "$ecpu") launch_env=()
		[ "$MEM_STATS_PEERS" = 0 ] || launch_env=(FAKE_ENVOY_STATS_PEERS="$MEM_STATS_PEERS")
		[ "$MEM_APP_BYTES" = 0 ] || launch_env+=("ISTIO_PROMETHEUS_ANNOTATIONS={\"scrape\":\"true\",\"path\":\"/metrics\",\"port\":\"$app_port\"}")
		launch "$v" "$dir" "$cg"
		agent_cgroups=() envoy_cgroups=() launch_env=()
		wait_ready "$status_port" "$agent_pid" || { echo "bench-vs-istio: $v never became ready" >&2; tail -20 "$dir/agent.log" >&2; exit 1; }
		cg_of[$v]=$cg ecg_of[$v]=$ecg cpu_of[$v]=$cpu pid_of[$v]=$agent_pid port_of[$v]=$status_port eport_of[$v]=$envoy_status_port
	done
	idle_window "$IDLE" eport_of "${prometheus_scrape[@]}"
	sample_load
	for v in "${variants[@]}"; do
		cg=${cg_of[$v]} ecg=${ecg_of[$v]} pid=${pid_of[$v]}
		# The agent's CPU across the idle window (its cgroup: the agent
		# alone), in seconds per hour.
		record idle-cpu-s-per-h "$v" "$(per_hour "${cpu_ns_of[$v]}" "$window_ms")"
		# The container's (agent and stand-in Envoy): since #36 ours has
		# Envoy answer the probe while the agent is ready, so the pod's
		# total is shown beside the agent's. The stand-in is a Go program,
		# not Envoy: its share is indicative only.
		record idle-cpu-container-s-per-h "$v" "$(per_hour $((cpu_ns_of[$v] + ecpu_ns_of[$v])) "$window_ms")"
		# The container (agent and stand-in Envoy) as the earlier rows,
		# and the agent's cgroup alone.
		record ws-mib "$v" "$(mib "$(ws "$cg" "$ecg")")"
		record agent-ws-mib "$v" "$(mib "$(ws "$cg")")"
		record usage-mib "$v" "$(mib $(($(cat "$cg/memory.usage_in_bytes") + $(cat "$ecg/memory.usage_in_bytes"))))"
		for k in total_rss total_cache total_mapped_file total_active_file total_inactive_file; do
			record "cg-$k-mib" "$v" "$(mib $(($(cgval "$cg" $k) + $(cgval "$ecg" $k))))"
		done
		record agent-cg-total_rss-mib "$v" "$(mib "$(cgval "$cg" total_rss)")"
		for k in VmRSS RssAnon RssFile; do
			record "proc-$k-mib" "$v" "$(awk -v k="$k:" '$1 == k {printf "%.1f", $2 / 1024}' "/proc/$pid/status")"
		done
		# What the agent's file RSS is (#24): its executable's pages
		# (text, rodata, pclntab) against the rest (shared libraries:
		# Istio's agent is linked dynamically).
		record proc-exe-rss-mib "$v" "$(awk -v exe="$(readlink "/proc/$pid/exe")" '
			/^[0-9a-f]+-[0-9a-f]+ / {cur = $6}
			$1 == "Rss:" && cur == exe {s += $2}
			END {printf "%.1f", s / 1024}' "/proc/$pid/smaps")"
		for k in Private_Dirty Shared_Clean Private_Clean; do
			record "smaps-$k-mib" "$v" "$(awk -v k="$k:" '$1 == k {printf "%.1f", $2 / 1024}' "/proc/$pid/smaps_rollup")"
		done
		# The copy this agent runs (its pages, charged to this cgroup);
		# the floor has no `version`.
		case $v in floor*) continue ;; esac
		bin=$work/mem-$v-$r/bin/meshagent
		[ "$v" = istio ] && bin=$work/mem-$v-$r/bin/pilot-agent
		sh -c "echo \$\$ >$cg/cgroup.procs && exec $bin version" >/dev/null 2>&1 || true
		record ws-exec-mib "$v" "$(mib "$(ws "$cg" "$ecg")")"
		record cg-active-exec-mib "$v" "$(mib $(($(cgval "$cg" total_active_file) + $(cgval "$ecg" total_active_file))))"
	done
	if [ "$IDLE_DIRECT" -gt 0 ]; then
		idle_window "$IDLE_DIRECT" port_of
		sample_load
		for v in "${variants[@]}"; do record idle-cpu-direct-s-per-h "$v" "$(per_hour "${cpu_ns_of[$v]}" "$window_ms")"; done
	fi
	for v in "${variants[@]}"; do
		stop "${pid_of[$v]}"
		rmdir "${cg_of[$v]}" "${ecg_of[$v]}" "${cpu_of[$v]}" "${cpu_of[$v]}-envoy" 2>/dev/null || true
	done
done
variants=("${agents[@]}")

# 3. xDS through the whole agent.
if has xds; then
echo "bench-vs-istio: xDS, $SIZES clusters, $XDS_ROUNDS pushes each..." >&2
mkdir -p "$work/xds-istio/etc"
cp -r "$work/certs" "$work/xds-istio/etc/certs"
M=$work/bin/meshagent
timeout 1800 "$work/bin/xdsbench" -rounds "$XDS_ROUNDS" -small "$SMALL" -sizes "$SIZES" -settle "${XDS_SETTLE}s" \
	-agent "meshagent=$M,--root={dir}" \
	-agent "gogc100=$M,GOGC=100,--root={dir}" \
	-agent "memlimit=$M,GOGC=100,GOMEMLIMIT=$MEMLIMIT,--root={dir}" \
	-istio "$work/bin/pilot-agent" -istio-dir "$work/xds-istio" -cgroups "$cgroot" -tsv "$work/xds.tsv" >"$work/xds.out" 2>&1 ||
	{ echo "bench-vs-istio: xdsbench failed:" >&2; tail -20 "$work/xds.out" >&2; exit 1; }
sample_load
fi

# 4. Start and reconnect against istiod (#24): the Go test's one line per
# round, "istiod-bench round R: FIGURE OURS ISTIO RATIO ...", recorded
# here and kept for the per-round ratios under the table.
istiod_phase() {
	echo "bench-vs-istio: start and reconnect against istiod, $ISTIOD_ROUNDS rounds..." >&2
	MESHAGENT_ISTIOD_BENCH_ROUNDS=$ISTIOD_ROUNDS MESHAGENT_BENCH_AGENT="$work/bin/meshagent" \
		MESHAGENT_ISTIO_AGENT="$work/bin/pilot-agent" go test -count=1 -timeout 30m \
		-run '^TestIstiodStartReconnectBench$' -v ./cmd/meshagent/e2e >"$work/istiod.out" 2>&1 ||
		{ echo "bench-vs-istio: the istiod benchmark failed:" >&2; tail -30 "$work/istiod.out" >&2; exit 1; }
	grep -o 'istiod-bench round .*' "$work/istiod.out" >"$work/istiod.rounds" || true
	if [ ! -s "$work/istiod.rounds" ]; then
		echo "bench-vs-istio: the istiod benchmark measured nothing:" >&2
		grep -E -- '--- SKIP|SKIP:|e2e_istiod' "$work/istiod.out" | tail -5 >&2
		return 0
	fi
	local line f a b
	while read -r line; do
		set -- ${line#*: }
		while [ $# -ge 4 ]; do
			f=$1 a=$2 b=$3
			record "istiod-$f" meshagent "$a"
			record "istiod-$f" istio "$b"
			shift 4
		done
	done <"$work/istiod.rounds"
	sample_load
}
if has istiod; then istiod_phase; fi

# 5. DNS (#24): both agents with DNS capture on (ISTIO_META_DNS_CAPTURE=true,
# each DNS proxy on a port of its own, DNS_PROXY_ADDR), the same NDS table of
# DNS_HOSTS names from a control plane of this phase, forwarding to a dnsmasq
# this script starts on a loopback address (port 53: resolv.conf cannot name
# a port): meshagent reads it with --resolv-conf, Istio's agent as its
# /etc/resolv.conf in a mount namespace of its own. dnsperf against each
# agent and against dnsmasq directly (the floor), mesh names and forwarded
# names, taking turns (order rotated each round), DNS_ROUNDS rounds: the
# saturation QPS (8 clients, 100 queries outstanding, DNS_DURATION s) and
# the p99 latency at a fixed DNS_RATE queries/s.
#     DNS_PINNED=1 (the default) adds the same runs with the load generator
# and the agent on CPUs of their own, as a sidecar runs (its own CPU share,
# the client elsewhere): dnsperf on CPU 0, the agent under test on CPU 1 (a
# second instance of each agent, started there, so that it sees one CPU as in
# a cpuset of one: GOMAXPROCS 1), dnsmasq on CPU 0 beside dnsperf when it is
# the agents' upstream and on CPU 1 when queried directly (the floor). They
# take turns with the unpinned runs in the same rotation. The machine's other
# work is not pinned: it still shares both CPUs.
DNS_HOSTS=${DNS_HOSTS:-1000}
DNS_ROUNDS=${DNS_ROUNDS:-3}
DNS_DURATION=${DNS_DURATION:-5}
DNS_RATE=${DNS_RATE:-10000}
DNS_PINNED=${DNS_PINNED:-1}
# DNS_PROFILE=DIR: a CPU profile of meshagent (--profiling, on its status
# port) over each of its first round's saturation runs, in DIR (for pprof).
DNS_PROFILE=${DNS_PROFILE:-}
# 6. Names (#24): a table of NAMES names (and, for the baseline, of one) sent
# over NDS to each agent by a control plane of its own, the agent in a cgroup
# of its own: its working set, anon, RSS and peaks NAMES_IDLE s after the
# table answers (memory per name = the difference / NAMES); then a swap to a
# table whose every address changed: from the control plane's push to the
# first answer with the new address (the control plane probes every 0.5 ms),
# and the agent's CPU time and cgroup peak across it. NAMES_ROUNDS rounds.
NAMES=${NAMES:-100000}
NAMES_ROUNDS=${NAMES_ROUNDS:-2}
NAMES_IDLE=${NAMES_IDLE:-10}

# dns_wait PORT NAME: until the DNS server on 127.0.0.1:PORT answers NAME
# with an address (bounded: 60 s).
dns_wait() {
	local end=$(($(now_ms) + 60000))
	while [ "$(now_ms)" -lt $end ]; do
		if dig +short +time=1 +tries=1 @127.0.0.1 -p "$1" "$2" A 2>/dev/null | grep -q '^[0-9]'; then return 0; fi
		sleep 0.05
	done
	return 1
}

# dns_env PORT: what both agents of the DNS phases run with.
dns_env() {
	launch_env=(ISTIO_META_DNS_CAPTURE=true DNS_PROXY_ADDR="127.0.0.1:$1")
	meshagent_args=(--resolv-conf "$work/dns/resolv.conf")
	istio_wrap=(unshare -m sh -c 'mount --bind "$0" /etc/resolv.conf && exec "$@"' "$work/dns/resolv.conf")
}

# on_cpu CPUS CMD...: CMD run in this shell (the variables it sets stay set)
# with the shell pinned to CPUS, so that what it starts runs there.
on_cpu() {
	local cpus=$1 all rc=0
	shift
	all=$(taskset -pc $BASHPID | awk '{print $NF}')
	taskset -pc "$cpus" $BASHPID >/dev/null
	"$@" || rc=$?
	taskset -pc "$all" $BASHPID >/dev/null
	return $rc
}

# dns_start_cp NAMES FILE [PROBE]: a control plane serving NAMES names over
# NDS (swaps on the lines written to FILE.in, a fifo held open on fd 7 while
# it runs); its address in $xds, its pid in $cp_pid.
dns_start_cp() {
	rm -f "$2.in" "$2.out"
	mkfifo "$2.in"
	local probe=()
	[ -n "${3:-}" ] && probe=(-probe "$3")
	"$work/bin/controlplane" -namespace ns0 -names "$1" "${probe[@]}" <"$2.in" >"$2.out" &
	cp_pid=$!
	pids+=("$cp_pid")
	exec 7>"$2.in"
	local end=$(($(now_ms) + 30000))
	until [ -s "$2.out" ] || [ "$(now_ms)" -gt $end ]; do sleep 0.05; done
	xds=$(head -1 "$2.out")
}

dns_stop_cp() {
	exec 7>&-
	kill "$cp_pid" 2>/dev/null || true
	wait "$cp_pid" 2>/dev/null || true
}

if has dns || has names; then
	require bench-vs-istio "apt-get install -y dnsperf dnsmasq dnsutils util-linux" dnsperf dnsmasq dig unshare
	mkdir -p "$work/dns"
	up=$(bench_upstream)
	pod_resolv_conf "$up" >"$work/dns/resolv.conf"
	for ((i = 0; i < DNS_HOSTS; i++)); do echo "$(mesh_ip "$i") $(mesh_name "$i")"; done >"$work/dns/hosts"
	for ((i = 0; i < DNS_HOSTS; i++)); do echo "$(mesh_name "$i") A"; done >"$work/dns/local.txt"
	for ((i = 0; i < DNS_HOSTS; i++)); do echo "name$i.upstream.test A"; done >"$work/dns/forwarded.txt"
	# The upstream: answers the mesh names from a hosts file (the floor for
	# mesh names) and *.upstream.test itself; forwards nothing.
	dnsmasq -k --conf-file=/dev/null --no-resolv --no-hosts --addn-hosts="$work/dns/hosts" --port=53 \
		--listen-address="$up" --bind-interfaces --pid-file= --user=root \
		--address=/upstream.test/192.0.2.77 --log-facility="$work/dns/dnsmasq.log" &
	dnsmasq_pid=$!
	pids+=($!)
	xds_saved=$xds
fi

if has dns; then
	echo "bench-vs-istio: DNS, $DNS_HOSTS mesh names over NDS, $DNS_ROUNDS rounds of ${DNS_DURATION}s saturation + ${DNS_DURATION}s at $DNS_RATE qps..." >&2
	dns_start_cp "$DNS_HOSTS" "$work/dns/cp"
	declare -A dns_port_of dns_pid_of dns_status_of
	dns_port_of[upstream]="$up 53"
	# A target is a variant, or a variant@pin: the pinned runs' own instance.
	agents=("${variants[@]}")
	targets=(upstream "${variants[@]}")
	if [ "$DNS_PINNED" = 1 ] && [ "$(nproc)" -ge 2 ]; then
		for v in "${variants[@]}"; do agents+=("$v@pin"); done
		targets+=(upstream@pin "${variants[@]/%/@pin}")
		dns_port_of[upstream@pin]="$up 53"
	fi
	for t in "${agents[@]}"; do
		v=${t%@pin} dir=$work/dns-${t/@/-}
		p=$(free_port)
		dns_env "$p"
		mkdir -p "$dir/bin"
		cp "$work/bin/fakeenvoy" "$dir/bin/"
		if [ $v = istio ]; then cp "$work/bin/pilot-agent" "$dir/bin/"; else cp "$work/bin/meshagent" "$dir/bin/"; fi
		case $t in
		*@pin) on_cpu 1 launch "$v" "$dir" "" ;;
		*) launch "$v" "$dir" "" ;;
		esac
		dns_pid_of[$t]=$agent_pid dns_status_of[$t]=$status_port
		if ! wait_ready "$status_port" "$agent_pid" || ! dns_wait "$p" "$(mesh_name $((DNS_HOSTS - 1)))" ||
			! dns_wait "$p" name0.upstream.test; then
			echo "bench-vs-istio: $t's DNS proxy never answered:" >&2
			tail -20 "$dir/agent.log" >&2
			exit 1
		fi
		dns_port_of[$t]="127.0.0.1 $p"
	done
	launch_env=() meshagent_args=() istio_wrap=()
	allcpus=$(taskset -pc $BASHPID | awk '{print $NF}')
	for ((r = 0; r < DNS_ROUNDS; r++)); do
		n=${#targets[@]}
		for ((i = 0; i < n; i++)); do
			t=${targets[$(((i + r) % n))]}
			read -r host port <<<"${dns_port_of[$t]}"
			# Where dnsperf and dnsmasq run for this target.
			client=() dnsmasq_cpus=$allcpus
			case $t in
			upstream@pin) client=(taskset -c 0) dnsmasq_cpus=1 ;;
			*@pin) client=(taskset -c 0) dnsmasq_cpus=0 ;;
			esac
			taskset -pc "$dnsmasq_cpus" "$dnsmasq_pid" >/dev/null
			for kind in local forwarded; do
				out=$work/dns/$t-$kind-$r
				pid=${dns_pid_of[$t]:-}
				[ -n "$pid" ] && cpu0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
				prof=
				if [ -n "$DNS_PROFILE" ] && [ "$r" = 0 ] && [ "${t%@pin}" = meshagent ]; then
					mkdir -p "$DNS_PROFILE"
					curl -sf -o "$DNS_PROFILE/${t/@/-}-$kind.pprof" "http://127.0.0.1:${dns_status_of[$t]}/debug/pprof/profile?seconds=$((DNS_DURATION > 1 ? DNS_DURATION - 1 : 1))" &
					prof=$!
				fi
				"${client[@]}" dnsperf -s "$host" -p "$port" -d "$work/dns/$kind.txt" -l "$DNS_DURATION" -c 8 -q 100 >"$out.tput" 2>&1 || true
				[ -z "$prof" ] || wait "$prof" || true
				record "dns-qps-$kind" "$t" "$(awk '/Queries per second:/ {printf "%.0f", $4}' "$out.tput")"
				# The agent's CPU per query answered: what it costs, whatever
				# share of the 2 cores dnsperf and the others leave it.
				if [ -n "$pid" ]; then
					cpu1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
					record "dns-cpu-us-$kind" "$t" "$(awk -v c=$((cpu1 - cpu0)) -v hz="$(getconf CLK_TCK)" '/Queries completed:/ {if ($3 > 0) printf "%.2f", c / hz * 1e6 / $3}' "$out.tput")"
				fi
				"${client[@]}" dnsperf -s "$host" -p "$port" -d "$work/dns/$kind.txt" -l "$DNS_DURATION" -c 8 -Q "$DNS_RATE" -v >"$out.lat" 2>&1 || true
				# "> NOERROR name A 0.000123": latency in seconds, 5th field.
				awk '/^> / {print $5}' "$out.lat" | sort -g >"$out.sorted"
				k=$((($(wc -l <"$out.sorted") * 99 + 99) / 100))
				record "dns-p99-us-$kind" "$t" "$(awk -v k=$k 'NR == k {printf "%.1f", $1 * 1e6}' "$out.sorted")"
				rm -f "$out.lat" "$out.sorted"
			done
		done
		sample_load
	done
	taskset -pc "$allcpus" "$dnsmasq_pid" >/dev/null
	for t in "${agents[@]}"; do stop "${dns_pid_of[$t]}"; done
	dns_stop_cp
fi

if has names; then
	echo "bench-vs-istio: names, $NAMES names over NDS, $NAMES_ROUNDS rounds (each agent in a cgroup, then a swap)..." >&2
	for ((r = 0; r < NAMES_ROUNDS; r++)); do
		for v in $(rotate $r); do
			for n in 1 "$NAMES"; do
				dir=$work/names-$v
				mkdir -p "$dir/bin"
				cp "$work/bin/fakeenvoy" "$dir/bin/"
				if [ $v = istio ]; then cp "$work/bin/pilot-agent" "$dir/bin/"; else cp "$work/bin/meshagent" "$dir/bin/"; fi
				p=$(free_port)
				dns_start_cp "$n" "$work/dns/names-cp" "127.0.0.1:$p"
				dns_env "$p"
				cg=$cgroot/meshagent-bench-$$-names-$v-$r-$n
				mkdir "$cg"
				cgroups+=("$cg")
				echo 2G >"$cg/memory.limit_in_bytes"
				t0=$(now_ms)
				launch "$v" "$dir" "$cg"
				launch_env=() meshagent_args=() istio_wrap=()
				if ! wait_ready "$status_port" "$agent_pid" || ! dns_wait "$p" "$(mesh_name $((n - 1)))"; then
					echo "bench-vs-istio: $v never answered from a table of $n names:" >&2
					tail -20 "$dir/agent.log" >&2
					exit 1
				fi
				record "names-load-ms-$n" "$v" $(($(now_ms) - t0))
				sleep "$NAMES_IDLE"
				usage=$(cat "$cg/memory.usage_in_bytes")
				inactive=$(cgval "$cg" total_inactive_file)
				record "names-ws-mib-$n" "$v" "$(awk -v u="$usage" -v i="$inactive" 'BEGIN {printf "%.2f", (u - i) / 1048576}')"
				record "names-anon-mib-$n" "$v" "$(awk -v u="$(cgval "$cg" total_rss)" 'BEGIN {printf "%.2f", u / 1048576}')"
				record "names-cgpeak-mib-$n" "$v" "$(awk -v u="$(cat "$cg/memory.max_usage_in_bytes")" 'BEGIN {printf "%.2f", u / 1048576}')"
				for k in VmRSS RssAnon VmHWM; do
					record "names-$k-mib-$n" "$v" "$(awk -v k="$k:" '$1 == k {printf "%.2f", $2 / 1024}' "/proc/$agent_pid/status")"
				done
				if [ "$n" = "$NAMES" ]; then
					echo 0 >"$cg/memory.max_usage_in_bytes" # the peak across the swap alone
					cpu0=$(awk '{print $14 + $15}' "/proc/$agent_pid/stat")
					echo swap >&7
					end=$(($(now_ms) + 90000))
					until grep -q '^swap-ms' "$work/dns/names-cp.out" || [ "$(now_ms)" -gt $end ]; do sleep 0.05; done
					sleep 2 # what the swap leaves to do after the first new answer (the old table's garbage)
					cpu1=$(awk '{print $14 + $15}' "/proc/$agent_pid/stat")
					ms=$(awk '/^swap-ms/ {print $2}' "$work/dns/names-cp.out")
					[ "$ms" = timeout ] || [ -z "$ms" ] && { echo "bench-vs-istio: $v never answered from the swapped table" >&2; exit 1; }
					record names-swap-ms "$v" "$ms"
					record names-swap-cpu-ms "$v" $(((cpu1 - cpu0) * 1000 / $(getconf CLK_TCK)))
					record names-swap-cgpeak-mib "$v" "$(awk -v u="$(cat "$cg/memory.max_usage_in_bytes")" 'BEGIN {printf "%.2f", u / 1048576}')"
				fi
				stop "$agent_pid"
				dns_stop_cp
				rmdir "$cg" 2>/dev/null || true
			done
		done
		sample_load
	done
fi
if has dns || has names; then xds=$xds_saved; fi

# The rows of phases 4 and 5, for the table: Python the table's script runs
# with its vals, med and rows (each ratio with the ratio of every round).
printf 'dnsr, rate, names, namesr = %s, %s, %s, %s\n' "$DNS_ROUNDS" "$DNS_RATE" "$NAMES" "$NAMES_ROUNDS" >"$work/rows-dns.py"
cat >>"$work/rows-dns.py" <<'PY'
def rounds(f, a, b):
    return ", ".join(f"{x / y:.2f}" for x, y in zip(vals.get((f, a), []), vals.get((f, b), [])) if y)
def row(name, f, fmt="{:.0f}", a="meshagent", b="istio"):
    x, y = med(f, a), med(f, b)
    if x is None or y is None: return
    rows.append((name, fmt.format(x), fmt.format(y), f"{x / y:.2f} (rounds: {rounds(f, a, b)})"))
# Each DNS figure unpinned, then pinned ("@pin": dnsperf on CPU 0, the agent
# on CPU 1) on the line below when the run had them.
for kind, label in (("local", "mesh names"), ("forwarded", "forwarded names")):
    for sfx, pre in (("", ""), ("@pin", "  pinned: ")):
        if not vals.get((f"dns-qps-{kind}", "meshagent" + sfx)): continue
        a, b, up = "meshagent" + sfx, "istio" + sfx, "upstream" + sfx
        row(f"{pre or 'DNS '}{label}, saturation QPS (median of {dnsr})", f"dns-qps-{kind}", a=a, b=b)
    for sfx, pre in (("", ""), ("@pin", "  pinned: ")):
        a, b = "meshagent" + sfx, "istio" + sfx
        row(f"{pre or 'DNS '}{label}, p99 µs at {rate} qps", f"dns-p99-us-{kind}", a=a, b=b)
    for sfx, pre in (("", ""), ("@pin", "  pinned: ")):
        a, b = "meshagent" + sfx, "istio" + sfx
        row(f"{pre or 'DNS '}{label}, agent CPU µs per query (saturation runs)", f"dns-cpu-us-{kind}", "{:.1f}", a=a, b=b)
    # Each agent against the upstream queried directly, in the same round.
    for sfx, pre in (("", "  "), ("@pin", "  pinned: ")):
        a, b, up = "meshagent" + sfx, "istio" + sfx, "upstream" + sfx
        if not vals.get((f"dns-qps-{kind}", up)) or not vals.get((f"dns-qps-{kind}", a)): continue
        u = med(f"dns-qps-{kind}", up)
        m, i = med(f"dns-qps-{kind}", a), med(f"dns-qps-{kind}", b)
        rows.append((f"{pre}{label} QPS / dnsmasq direct ({u:.0f} QPS)", f"{m / u:.2f} (rounds: {rounds(f'dns-qps-{kind}', a, up)})",
                     f"{i / u:.2f} (rounds: {rounds(f'dns-qps-{kind}', b, up)})", f"{m / i:.2f}"))
if vals.get((f"names-ws-mib-{names}", "istio")):
    for f, label in (("ws", "working set"), ("anon", "cgroup anon"), ("VmRSS", "agent RSS"), ("RssAnon", "agent anon")):
        row(f"{names} names: {label}, MiB (median of {namesr})", f"names-{f}-mib-{names}", "{:.1f}")
        a = [(x - y) * 1048576 / (names - 1) for x, y in zip(vals[(f"names-{f}-mib-{names}", "meshagent")], vals[(f"names-{f}-mib-1", "meshagent")])]
        b = [(x - y) * 1048576 / (names - 1) for x, y in zip(vals[(f"names-{f}-mib-{names}", "istio")], vals[(f"names-{f}-mib-1", "istio")])]
        ma, mb = statistics.median(a), statistics.median(b)
        rows.append((f"  {label} per name, bytes (vs a 1-name table)", f"{ma:.0f}", f"{mb:.0f}", f"{ma / mb:.2f} (rounds: {', '.join(f'{x / y:.2f}' for x, y in zip(a, b))})"))
    row(f"{names} names: cgroup peak, MiB", f"names-cgpeak-mib-{names}", "{:.1f}")
    row(f"{names} names: agent peak RSS (VmHWM), MiB", f"names-VmHWM-mib-{names}", "{:.1f}")
    row(f"{names} names: start → the last name answers, ms", f"names-load-ms-{names}")
    row(f"{names} names: swap, push → first new answer, ms", "names-swap-ms", "{:.1f}")
    row(f"{names} names: swap, agent CPU ms (to 2 s after)", "names-swap-cpu-ms")
    row(f"{names} names: cgroup peak across the swap, MiB", "names-swap-cgpeak-mib", "{:.1f}")
PY

# The table.
python3 - "$work/results" "$work/xds.tsv" "${loads[*]}" "$IDLE" "$MEM_ROUNDS" "$START_ROUNDS" "$XDS_ROUNDS" "$MEMLIMIT" "$work/istiod.rounds" <<'EOF'
import os, statistics, sys
res, xtsv, loads, idle, memr, startr, xr, memlimit, irounds = sys.argv[1:]
vals = {}
for line in open(res):
    f, v, x = line.split()
    vals.setdefault((f, v), []).append(float(x))
def med(f, v):
    xs = vals.get((f, v))
    return statistics.median(xs) if xs else None
def spread(f, v):
    xs = sorted(vals.get((f, v), []))
    if len(xs) < 2: return ""
    return f" [{xs[0]:g}–{xs[-1]:g}]"
rows = []
def row(name, a, b, sa="", sb="", fmt="{:.1f}"):
    r = f"{a / b:.2f}" if a is not None and b else "n/a"
    rows.append((name, (fmt.format(a) if a is not None else "?") + sa, (fmt.format(b) if b is not None else "?") + sb, r))
if vals.get(("start-ready-ms", "istio")):
  row(f"start → ready, ms (median [min–max] of {startr})", med("start-ready-ms", "meshagent"), med("start-ready-ms", "istio"),
    spread("start-ready-ms", "meshagent"), spread("start-ready-ms", "istio"), "{:.0f}")
for f, label in [("agent-ws-mib", "agent's cgroup (the agent alone): working set"),
                 ("agent-cg-total_rss-mib", "agent's cgroup (the agent alone): anon (total_rss)"),
                 ("ws-mib", "container (agent + stand-in Envoy) working set"), ("cg-total_rss-mib", "cgroup anon (total_rss)"),
                 ("cg-total_cache-mib", "cgroup page cache"), ("cg-total_active_file-mib", "cgroup active file"),
                 ("cg-total_mapped_file-mib", "cgroup mapped file"),
                 ("ws-exec-mib", "working set after one more exec of the binary"),
                 ("cg-active-exec-mib", "cgroup active file after one more exec"),
                 ("proc-VmRSS-mib", "agent RSS"), ("proc-RssAnon-mib", "agent anon"), ("proc-RssFile-mib", "agent file RSS"),
                 ("proc-exe-rss-mib", "  of which its executable"), ("smaps-Private_Dirty-mib", "agent private dirty (smaps)"),
                 ("smaps-Private_Clean-mib", "agent private clean (smaps)"), ("smaps-Shared_Clean-mib", "agent shared clean (smaps)")]:
    if not vals.get((f, "istio")): continue
    row(f"idle {label}, MiB (median [min–max] of {memr})", med(f, "meshagent"), med(f, "istio"), spread(f, "meshagent"), spread(f, "istio"))
if vals.get(("idle-cpu-s-per-h", "istio")):
    row(f"idle agent CPU, s per hour: probe via Envoy's 15021, Prometheus's scrape ({idle} s windows, median [min–max] of {memr})", med("idle-cpu-s-per-h", "meshagent"), med("idle-cpu-s-per-h", "istio"),
        spread("idle-cpu-s-per-h", "meshagent"), spread("idle-cpu-s-per-h", "istio"), "{:.2f}")
if vals.get(("idle-cpu-container-s-per-h", "istio")):
    row(f"idle container CPU (agent and stand-in Envoy), s per hour, the same window (median [min–max] of {memr})", med("idle-cpu-container-s-per-h", "meshagent"), med("idle-cpu-container-s-per-h", "istio"),
        spread("idle-cpu-container-s-per-h", "meshagent"), spread("idle-cpu-container-s-per-h", "istio"), "{:.2f}")
if vals.get(("idle-cpu-direct-s-per-h", "istio")):
    row(f"idle agent CPU, s per hour: probe to 15020 on a new connection, bare scrape (as before #36; median [min–max] of {memr})", med("idle-cpu-direct-s-per-h", "meshagent"), med("idle-cpu-direct-s-per-h", "istio"),
        spread("idle-cpu-direct-s-per-h", "meshagent"), spread("idle-cpu-direct-s-per-h", "istio"), "{:.2f}")
# The floor (bench/vs-istio/floor, #36): a Go program doing only the idle
# window's job with the agents' libraries; its ratio is the least any Go
# agent could reach against Istio's agent here.
# The floor with meshagent's packages linked splits the agent's idle memory
# into the floor, what its packages hold once initialised, and the rest
# (what its services hold).
for v, who in (("floor", "the floor"), ("floorlinks", "the floor with meshagent's packages linked")):
    if not vals.get(("agent-cg-total_rss-mib", v)): continue
    for f, label in [("agent-ws-mib", "agent's cgroup: working set"), ("agent-cg-total_rss-mib", "agent's cgroup: anon (total_rss)"),
                     ("proc-RssAnon-mib", "agent anon"), ("idle-cpu-s-per-h", "agent CPU, s per hour")]:
        row(f"{who}, idle {label} (median [min–max] of {memr}), against Istio's agent", med(f, v), med(f, "istio"),
            spread(f, v), spread(f, "istio"), "{:.2f}" if "cpu" in f else "{:.1f}")
# The split itself: meshagent's idle anon as the floor, what its packages
# add once initialised (the linked floor less the floor), and what its
# services add (meshagent less the linked floor).
if vals.get(("agent-cg-total_rss-mib", "floorlinks")) and vals.get(("agent-cg-total_rss-mib", "floor")):
    f = "agent-cg-total_rss-mib"
    floor, linked, ours = med(f, "floor"), med(f, "floorlinks"), med(f, "meshagent")
    rows.append((f"idle agent anon split, MiB: the floor + meshagent's packages + its services (medians of {memr})",
                 f"{floor:.1f} + {linked - floor:.1f} + {ours - linked:.1f}", f"{med(f, 'istio'):.1f}", f"{ours / med(f, 'istio'):.2f}"))
row("binary size, MB", med("binary-mb", "meshagent"), med("binary-mb", "istio"))
for f, label in [("start-ready-ms", "start → ready against istiod, ms"),
                 ("start-cpu-ms", "  CPU of the agent and its Envoy at ready, ms"),
                 ("reconnect-ms", "istiod back after 2 s down → reconnected (from its start), ms"),
                 ("reconnect-after-ports-ms", "  the same, from istiod's ports open, ms")]:
    f = "istiod-" + f
    if not vals.get((f, "istio")): continue
    n = len(vals[(f, "istio")])
    row(f"{label} (median [min–max] of {n})", med(f, "meshagent"), med(f, "istio"), spread(f, "meshagent"), spread(f, "istio"), "{:.0f}")
x = {}
for line in open(xtsv) if os.path.exists(xtsv) else []:
    f, t, m, p25, p75 = line.split("\t")
    x[(f, t)] = (float(m), float(p25), float(p75))
sizes = sorted({int(f.rsplit("-", 1)[1]) for f, _ in x if f.startswith("push-")})
names = {"meshagent": "", "gogc100": "  meshagent GOGC=100", "memlimit": f"  meshagent GOGC=100 GOMEMLIMIT={memlimit}"}
for n in sizes:
    for proto in ("sotw", "delta"):
        f = f"push-{proto}-{n}"
        d = x[(f, "direct")][0]
        i = x[(f, "istio")]
        for t, label in names.items():
            m = x[(f, t)]
            rows.append((label or f"xDS {proto} {n} clusters, recv via agent / direct (median, IQR/direct, {xr} pushes)",
                         f"{m[0]/d:.2f} [{m[1]/d:.2f}–{m[2]/d:.2f}]", f"{i[0]/d:.2f} [{i[1]/d:.2f}–{i[2]/d:.2f}]", f"{m[0]/i[0]:.2f}"))
for proto in ("sotw", "delta"):
    f = f"small-{proto}"
    if (f, "direct") not in x: continue
    d = x[(f, "direct")][0]
    i = x[(f, "istio")][0] - d
    for t, label in names.items():
        a = x[(f, t)][0] - d
        rows.append((label or f"small update {proto}, added p50 ms", f"{a:+.3f}", f"{i:+.3f}", f"{a/i:.2f}" if i > 0 else "n/a"))
# Memory across the pushes (#24): peak RSS (VmHWM, the executable's pages
# included), peak anon (RssAnon) and the peak working set of the agent's
# cgroup, each with its value before the pushes.
for n in sizes:
    for f, label, before in (("peak-rss", "peak RSS (VmHWM)", None), ("peak-anon", "peak anon (RssAnon)", "idle-anon"),
                             ("peak-ws", "peak working set (cgroup)", "idle-ws"),
                             ("settled-anon", f"anon {os.environ.get('XDS_SETTLE')} s after the pushes", "idle-anon"),
                             ("settled-ws", f"working set {os.environ.get('XDS_SETTLE')} s after the pushes", "idle-ws")):
        if (f"{f}-{n}", "istio") not in x: continue
        i = x[(f"{f}-{n}", "istio")][0]
        i0 = f" (before {x[(f'{before}-{n}', 'istio')][0]:.1f})" if before else ""
        for t, tl in names.items():
            a = x[(f"{f}-{n}", t)][0]
            a0 = f" (before {x[(f'{before}-{n}', t)][0]:.1f})" if before else ""
            rows.append((tl or f"xDS {label} {n} clusters, MiB", f"{a:.1f}{a0}", f"{i:.1f}{i0}", f"{a/i:.2f}"))
# Phases 4 and 5 (dns, names) add their rows: their code is theirs, above.
extra = os.path.join(os.path.dirname(res), "rows-dns.py")
if os.path.exists(extra): exec(open(extra).read())
w0 = max(len(r[0]) for r in rows); w1 = max(len(r[1]) for r in rows + [("", "meshagent")]); w2 = max(len(r[2]) for r in rows + [("", "", "Istio's agent")])
print()
print(f"| {'figure':<{w0}} | {'meshagent':<{w1}} | {'Istio' + chr(39) + 's agent':<{w2}} | ratio |")
print(f"|{'-'*(w0+2)}|{'-'*(w1+2)}|{'-'*(w2+2)}|-------|")
for r in rows:
    print(f"| {r[0]:<{w0}} | {r[1]:<{w1}} | {r[2]:<{w2}} | {r[3]:>5} |")
scrape = "".join(f"; {v} {k}" for k, v in (("peers in Envoy's exposition", os.environ.get("MEM_STATS_PEERS", "0")),
                                          ("bytes of application exposition", os.environ.get("MEM_APP_BYTES", "0"))) if v != "0")
print(f"\nload average (1 min) during the run: {loads}; idle {idle}s{scrape}; ratio = meshagent / Istio's agent")
if os.path.exists(irounds) and os.path.getsize(irounds):
    per = {}
    for line in open(irounds):
        fs = line.split(": ", 1)[1].split()
        for i in range(0, len(fs) - 3, 4):
            per.setdefault(fs[i], []).append(fs[i + 3])
    print("against istiod, meshagent / Istio's agent per round: " + "; ".join(f"{k} {' '.join(v)}" for k, v in per.items()))
EOF
