# Shared by the benchmark scripts (sourced, not run): what a script needs
# before it starts, and the work directory whose background processes are
# stopped and removed on exit however the script ends.

# require NAME HINT BIN...: every BIN on PATH, else say what to install
# (HINT) and skip the benchmark (exit 0: a missing tool is not a failure).
require() {
	local name=$1 hint=$2
	shift 2
	for bin in "$@"; do
		if ! command -v "$bin" >/dev/null; then
			echo "$name: $bin not found ($hint): skipped"
			exit 0
		fi
	done
}

# require_root NAME WHY: skip the benchmark unless running as root.
require_root() {
	if [ "$(id -u)" != 0 ]; then
		echo "$1: needs root ($2): skipped"
		exit 0
	fi
}

# start_work: $work is a fresh directory; every pid appended to $pids is
# killed and reaped, and $work removed, on exit.
start_work() {
	work=$(mktemp -d)
	pids=()
	trap cleanup_work EXIT
}

cleanup_work() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$work"
}

# The benchmark mesh: HOSTS Kubernetes services over 10 namespaces,
# svcI.nsJ.svc.cluster.local at 10.1.x.y. mesh_name I and mesh_ip I are
# service I's name and address.
mesh_name() { echo "svc$1.ns$(($1 % 10)).svc.cluster.local"; }
mesh_ip() { echo "10.1.$(($1 / 250)).$(($1 % 250 + 1))"; }

# mesh_table HOSTS: the mesh as the agent's name table file (Istio's NDS
# NameTable, as JSON), on stdout.
mesh_table() {
	local i sep
	echo '{"table": {'
	for ((i = 0; i < $1; i++)); do
		sep=","; [ "$i" -eq $(($1 - 1)) ] && sep=""
		echo "\"$(mesh_name "$i")\": {\"ips\": [\"$(mesh_ip "$i")\"], \"registry\": \"Kubernetes\", \"shortname\": \"svc$i\", \"namespace\": \"ns$((i % 10))\"}$sep"
	done
	echo '}}'
}

# bench_upstream: a random loopback address for the upstream dnsmasq (port
# 53: resolv.conf cannot name a port), out of the way of other runs.
bench_upstream() { echo "127.77.$((RANDOM % 200 + 1)).53"; }

# pod_resolv_conf NAMESERVER: a pod's resolv.conf in namespace ns0 (its
# search list and ndots:5, as kubelet writes it), on stdout.
pod_resolv_conf() {
	printf 'nameserver %s\nsearch ns0.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n' "$1"
}
