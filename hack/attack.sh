#!/usr/bin/env bash
# make attack (#33): the attack classes of issue 33 against a built agent,
# in a network namespace and a memory cgroup (v1, Istio's default sidecar
# limit of 1 GiB), bounded in count and time (a few minutes). It prints the
# agent's peak memory under each attack beside its bound, and fails if the
# agent dies, stops answering, or passes a bound. hack/attack/main.go is
# the attacker; this script builds and sets up.
#
#   ATTACK_PUSH_MIB  the single CDS push (default 32: the stand-in Envoy
#                    decodes it at ~5 times its size, and a larger one
#                    OOM-kills it inside the 1 GiB limit, as it would a real
#                    Envoy)
#   ATTACK_NAMES     the NDS table's names (default 200000)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "make attack: needs root (a network namespace, a memory cgroup)" >&2
	exit 1
fi
for tool in ip go nsenter; do
	command -v "$tool" >/dev/null || { echo "make attack: $tool is missing" >&2; exit 1; }
done
cgroot=/sys/fs/cgroup/memory
if [ ! -w "$cgroot" ]; then
	echo "make attack: no v1 memory cgroup at $cgroot" >&2
	exit 1
fi

work=$(mktemp -d /tmp/meshagent-attack.XXXXXX)
ns=meshagent-attack-$$
cg=$cgroot/meshagent-attack-$$
cleanup() {
	ip netns del "$ns" 2>/dev/null || true
	if [ -d "$cg" ]; then
		# Anything left in the cgroup (it should be empty) is ended first.
		for pid in $(cat "$cg/cgroup.procs" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
		sleep 0.2
		rmdir "$cg-cli" "$cg" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

echo "make attack: building into $work/bin"
mkdir -p "$work/bin"
CGO_ENABLED=0 go build -o "$work/bin/meshagent" ./cmd/meshagent
go build -o "$work/bin/fakeenvoy" ./testdata/fakeenvoy
go build -o "$work/bin/controlplane" ./bench/agent/controlplane
go build -o "$work/bin/attack" ./hack/attack
go run ./testdata/devcerts -out "$work/certs" -namespace ns0 >/dev/null

ip netns add "$ns"
ip netns exec "$ns" ip link set lo up
mkdir "$cg"

# nsenter, not ip netns exec: that one mounts a fresh /sys, without the
# cgroup file system.
timeout 900 nsenter --net="/run/netns/$ns" "$work/bin/attack" \
	-agent "$work/bin/meshagent" -envoy "$work/bin/fakeenvoy" -controlplane "$work/bin/controlplane" \
	-certs "$work/certs" -work "$work" -cgroup "$cg" \
	-push-mib "${ATTACK_PUSH_MIB:-32}" -names "${ATTACK_NAMES:-200000}"
