#!/usr/bin/env bash
# build-istio.sh — builds, once per machine, what the kube node needs to run
# Istio for real (#20), into $ISTIO_KUBE_CACHE/bin (default
# ~/.cache/meshagent-peers/istiod-kube/bin), never into the repo:
#   pilot-discovery, istioctl  Istio's own, from the Go module of ../shared/peers/istiod
#                              (its go.mod/go.sum copied to $ISTIO_KUBE_CACHE/src)
#   kube-proxy                 from the kube peer's wrapper module (same version and
#                              flags as its kubelet)
#   coredns                    go install github.com/coredns/coredns@$COREDNS_VERSION
# Each binary already in the cache is skipped. Needs the kube peer built first
# (its wrapper module); `build-istio.sh kube` runs the kube peer's build.sh
# first. Prints the bin directory on its last line.
set -euo pipefail
. "$(dirname "$0")/common.sh"
log() { printf '[build-istio %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
mkdir -p "$ISTIO_KUBE_BIN"
[ "${1:-}" = kube ] && bash "$KUBE_PEER/build.sh"

# 1. Istio: the same module (versions and replaces) as the istiod peer.
src=$ISTIO_KUBE_CACHE/src
if [ ! -f "$src/go.mod" ]; then
  mkdir -p "$src"
  cp "$PEERS/istiod/mod/go.mod" "$PEERS/istiod/mod/go.sum" "$src/"
  cat > "$src/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "istio.io/istio/istioctl/cmd/istioctl"
	_ "istio.io/istio/pilot/cmd/pilot-discovery"
)
GO
fi
for t in pilot-discovery:istio.io/istio/pilot/cmd/pilot-discovery istioctl:istio.io/istio/istioctl/cmd/istioctl; do
  name=${t%%:*} pkg=${t#*:}
  if [ -x "$ISTIO_KUBE_BIN/$name" ]; then log "$name: cached"; continue; fi
  log "building $name ..."; start=$SECONDS
  (cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o "$ISTIO_KUBE_BIN/$name.tmp" "$pkg")
  mv "$ISTIO_KUBE_BIN/$name.tmp" "$ISTIO_KUBE_BIN/$name"
  log "$name built in $((SECONDS - start))s"
done

# 2. kube-proxy, as the kube peer's build.sh builds its binaries.
if [ -x "$ISTIO_KUBE_BIN/kube-proxy" ]; then log "kube-proxy: cached"; else
  [ -f "$KUBE_SRC/go.mod" ] || { echo "no $KUBE_SRC/go.mod: build the kube peer first ($KUBE_PEER/build.sh)" >&2; exit 1; }
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  log "building kube-proxy ..."; start=$SECONDS
  (cd "$KUBE_SRC" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" \
     -o "$ISTIO_KUBE_BIN/kube-proxy.tmp" k8s.io/kubernetes/cmd/kube-proxy)
  mv "$ISTIO_KUBE_BIN/kube-proxy.tmp" "$ISTIO_KUBE_BIN/kube-proxy"
  log "kube-proxy built in $((SECONDS - start))s"
fi

# 3. CoreDNS (Debian has no package), as bench/dns installs it.
if [ -x "$ISTIO_KUBE_BIN/coredns" ]; then log "coredns: cached"; else
  log "installing coredns $COREDNS_VERSION ..."; start=$SECONDS
  (cd /tmp && CGO_ENABLED=0 GOBIN="$ISTIO_KUBE_BIN" go install "github.com/coredns/coredns@$COREDNS_VERSION")
  log "coredns built in $((SECONDS - start))s"
fi
echo "$ISTIO_KUBE_BIN"
