# common.sh — sourced by the hack/kube scripts: where the shared peers and the
# caches are (#20). The kube peer's env.sh gives the node's settings (netns,
# paths, kn/kctl helpers).
HACK_KUBE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HACK_KUBE/../.." && pwd)
# ../shared/peers beside the checkout (/work/main) or one level up (/work/wt/x).
if [ ! -d "${PEERS:-}/kube" ]; then
  PEERS=""
  for p in "$REPO/../shared/peers" "$REPO/../../shared/peers"; do
    [ -d "$p/kube" ] && { PEERS=$(cd "$p" && pwd); break; }
  done
fi
[ -n "${PEERS:-}" ] && [ -d "$PEERS/kube" ] || { echo "no shared peers found (set PEERS)" >&2; exit 1; }
KUBE_PEER=$PEERS/kube
. "$KUBE_PEER/env.sh"
# istiod, istioctl, kube-proxy and CoreDNS for the node, built by build-istio.sh.
ISTIO_KUBE_CACHE=${ISTIO_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meshagent-peers/istiod-kube}
ISTIO_KUBE_BIN=$ISTIO_KUBE_CACHE/bin
# State of what istio-up.sh starts on the node (inside the node's state dir,
# so down.sh removes it with the rest).
IK_ROOT=$KN_ROOT/istio
COREDNS_VERSION=${COREDNS_VERSION:-v1.12.1}
