#!/usr/bin/env bash
# install-deps.sh — the Debian packages the test suites use, installed once
# (#32): `make test` runs it first (through `make deps`), and so does a fresh
# CI machine through `make test` alone. Idempotent: installed packages are
# not touched, and with none missing it does nothing (no apt-get update).
# As a non-root user it installs nothing: it names what is missing, and the
# tests that need it skip with a reason. Appends what it skipped to the
# summary file given as $1 (`make test` prints it last).
set -euo pipefail
summary=${1:-/dev/null}

packages=(
  make git ca-certificates
  iptables iproute2      # capture tests in network namespaces
  nftables               # the native nftables capture backend (nft -f), #23
  dnsutils dnsmasq dnsperf  # dig, the upstream resolver, the DNS benchmark
  prometheus             # promtool checks the metrics exposition
  protobuf-compiler      # protoc, to check generated protos
  util-linux procps      # unshare, ps
  time                   # /usr/bin/time: the CLI's own peak memory against a hostile server (#33)
  systemd                # systemd-analyze verifies the VM unit
  chromium               # headless: a screenshot of the status page (/debug/)
  # the kube node (../shared/peers/kube/build.sh) and Istio on it (hack/kube)
  etcd-server containerd runc containernetworking-plugins conntrack curl openssl
  jq yq                  # istio-up.sh reads istioctl's rendered manifests
)

command -v go >/dev/null || { echo "install-deps: no go in PATH: install Go $(sed -n 's/^go //p' "$(dirname "$0")/../go.mod") or later (https://go.dev/dl/)" >&2; exit 1; }
if ! command -v dpkg-query >/dev/null; then
  echo "install-deps: not a Debian system (no dpkg-query): install the equivalents of: ${packages[*]}" | tee -a "$summary"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "skipped: apt-get install ${missing[*]} (not root; the tests needing them skip and say so)" | tee -a "$summary"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
start=$SECONDS
export DEBIAN_FRONTEND=noninteractive
# No package's postinst may start etcd or containerd on the host: the node
# runs them in a network namespace of its own.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: installed in $((SECONDS - start)) s"
