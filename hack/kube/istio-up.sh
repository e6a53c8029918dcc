#!/usr/bin/env bash
# istio-up.sh — Istio on the running kube node, for real (#20): Istio's CRDs,
# RBAC, mesh and injector configuration rendered from the module's own charts
# by `istioctl manifest generate`, applied to the node's kube-apiserver; then,
# as processes in the node's netns on the node IP, each PID in $IK_ROOT/pids:
#   kube-proxy (iptables mode)  so ClusterIPs route: the apiserver calls the
#                               injection webhook by its Service, pods reach
#                               istiod, CoreDNS and each other by ClusterIP;
#   coredns on $KN_NODE_IP:53   behind Service kube-system/kube-dns (10.96.0.10,
#                               the kubelet's clusterDNS), kubernetes plugin;
#   pilot-discovery             istiod, as ServiceAccount istio-system/istiod
#                               (a token kubeconfig: the chart's RBAC applies),
#                               behind Service istio-system/istiod, which has no
#                               selector and an EndpointSlice at $KN_NODE_IP.
# Run after the kube peer's up.sh; istio-down.sh stops all three.
# `istio-up.sh istiod` starts istiod again only (after `istio-down.sh istiod`),
# with the environment and token the first run saved.
#   MESHAGENT_PROXY_IMAGE  the sidecar image the injector defaults to (default
#                          `make image`'s localhost/meshagent-proxyv2:dev)
#                          (hub/name:tag; pods may override it with the
#                          sidecar.istio.io/proxyImage annotation)
#   ISTIO_VALUES           extra `istioctl manifest generate` flags
set -euo pipefail
. "$(dirname "$0")/common.sh"
T0=$(date +%s%N)
log() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf '[istio-up %3d.%01ds] %s\n' $((ms/1000)) $((ms%1000/100)) "$*"; }
for b in pilot-discovery istioctl kube-proxy coredns; do
  [ -x "$ISTIO_KUBE_BIN/$b" ] || { echo "missing $ISTIO_KUBE_BIN/$b: run hack/kube/build-istio.sh" >&2; exit 1; }
done
[ -e "/run/netns/$KN_NETNS" ] || { echo "the node is not up (run $KUBE_PEER/up.sh)" >&2; exit 1; }
P=$KN_ROOT/pki
start_bg() { # name dir cmd... — in the node netns, own session, pid in $IK_ROOT/pids
  local name=$1 dir=$2; shift 2
  (cd "$dir" && exec nsenter --net="/run/netns/$KN_NETNS" setsid "$@" > "$IK_ROOT/logs/$name.log" 2>&1 < /dev/null) &
  echo $! > "$IK_ROOT/pids/$name.pid"
}
wait_for() { # what[/detail] timeout cmd... — what names the log shown on a timeout
  local what=$1 timeout=$2; shift 2
  local end=$((SECONDS + timeout))
  until "$@" > /dev/null 2>&1; do
    if ((SECONDS >= end)); then
      echo "timeout ($timeout s) waiting for $what; last log lines:" >&2
      tail -n 30 "$IK_ROOT/logs/${what%%/*}.log" >&2 2>/dev/null || true
      exit 1
    fi
    sleep 0.2
  done
  log "$what ready"
}

# istiod as the Deployment would run it: its env and args saved by the first
# run, the downward-API values a pod would get, its ServiceAccount's kubeconfig.
start_istiod() {
  local envs=() args=()
  mapfile -t envs < "$IK_ROOT/istiod.env"
  mapfile -t args < "$IK_ROOT/istiod.args"
  start_bg istiod "$IK_ROOT/istiod" env -i PATH=/usr/bin:/bin HOME="$IK_ROOT/istiod" "${envs[@]}" \
    POD_NAME=istiod-"$KN_NODE" POD_NAMESPACE=istio-system SERVICE_ACCOUNT=istiod \
    INSTANCE_IP="$KN_NODE_IP" KUBECONFIG="$IK_ROOT/istiod.kubeconfig" \
    "$ISTIO_KUBE_BIN/pilot-discovery" "${args[@]}"
  wait_for istiod 120 kn curl -sf "http://$KN_NODE_IP:8080/ready"
}
if [ "${1:-}" = istiod ]; then
  [ -f "$IK_ROOT/istiod.env" ] || { echo "istio-up.sh has not run on this node" >&2; exit 1; }
  start_istiod
  exit 0
fi
[ -d "$IK_ROOT/pids" ] && { echo "$IK_ROOT exists: istio-down.sh first" >&2; exit 1; }
mkdir -p "$IK_ROOT"/{pids,logs,istiod,manifests}

# --- kube-proxy ------------------------------------------------------------------
# masqueradeAll: pods share one bridge, and a reply from B straight to A over
# the bridge would skip the un-DNAT of A's ClusterIP connection; conntrack
# maxPerCore 0 and zero timeouts leave the machine-wide conntrack settings alone.
cat > "$IK_ROOT/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$P/admin.kubeconfig"}
mode: iptables
hostnameOverride: $KN_NODE
clusterCIDR: $KN_POD_CIDR
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
iptables: {masqueradeAll: true, syncPeriod: 30s, minSyncPeriod: 0s}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
YAML
start_bg kube-proxy "$IK_ROOT" "$ISTIO_KUBE_BIN/kube-proxy" --config="$IK_ROOT/kube-proxy.yaml" --v=1
wait_for kube-proxy 30 kn curl -sf http://127.0.0.1:10256/healthz

# --- CoreDNS -------------------------------------------------------------------------
cat > "$IK_ROOT/Corefile" <<COREFILE
.:53 {
    bind $KN_NODE_IP
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $P/admin.kubeconfig kubenode
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
COREFILE
start_bg coredns "$IK_ROOT" "$ISTIO_KUBE_BIN/coredns" -conf "$IK_ROOT/Corefile"

# Services without selectors, their endpoints on the node IP.
svc_slice() { # ns name endpoint-ip "portname:port:proto ..."
  local ns=$1 name=$2 ip=$3 ports=$4 p
  echo "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: $name-node
  namespace: $ns
  labels: {kubernetes.io/service-name: $name, endpointslice.kubernetes.io/managed-by: meshagent-hack-kube}
addressType: IPv4
endpoints: [{addresses: [\"$ip\"], conditions: {ready: true}}]
ports:"
  for p in $ports; do IFS=: read -r pn pp pr <<<"$p"; echo "- {name: $pn, port: $pp, protocol: $pr}"; done
}
{ cat <<YAML
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  clusterIP: 10.96.0.10
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
---
YAML
  svc_slice kube-system kube-dns "$KN_NODE_IP" "dns:53:UDP dns-tcp:53:TCP"; } > "$IK_ROOT/manifests/kube-dns.yaml"
kctl apply -f "$IK_ROOT/manifests/kube-dns.yaml" >/dev/null
wait_for coredns 30 kn dig +time=1 +tries=1 @10.96.0.10 kubernetes.default.svc.cluster.local +short

# --- Istio's manifests, rendered by istioctl ------------------------------------------
img=${MESHAGENT_PROXY_IMAGE:-localhost/meshagent-proxyv2:dev}   # `make image`
hub=${img%/*} rest=${img##*/}
m=$IK_ROOT/manifests/istio.yaml
cat > "$IK_ROOT/manifests/operator.yaml" <<YAML
apiVersion: install.istio.io/v1alpha1
kind: IstioOperator
spec:
  profile: minimal
  hub: "$hub"
  tag: "${rest#*:}"
  meshConfig:
    defaultConfig:
      proxyMetadata:
        ISTIO_META_DNS_CAPTURE: "true"
  values:
    global:
      proxy: {image: "${rest%%:*}"}
      imagePullPolicy: IfNotPresent
    pilot:
      autoscaleEnabled: false
YAML
# shellcheck disable=SC2086
"$ISTIO_KUBE_BIN/istioctl" manifest generate -f "$IK_ROOT/manifests/operator.yaml" ${ISTIO_VALUES:-} \
  > "$m" 2> "$IK_ROOT/logs/istioctl.log" || { cat "$IK_ROOT/logs/istioctl.log" >&2; exit 1; }
# istioctl logs its warnings to stdout: what it rendered must start with YAML.
head -n1 "$m" | grep -qE '^(---|apiVersion:)' || { echo "istioctl printed more than manifests:" >&2; head -n 20 "$m" >&2; exit 1; }
log "rendered $(grep -c '^kind:' "$m") objects ($m)"
# Everything but istiod's Deployment and what only a Deployment needs; its
# Service without a selector (istiod is a process here, not a pod).
yq -y 'select(. != null) | select(.kind != "Deployment" and .kind != "HorizontalPodAutoscaler" and .kind != "PodDisruptionBudget")
       | if .kind == "Service" and .metadata.name == "istiod" then del(.spec.selector) else . end' "$m" \
  > "$IK_ROOT/manifests/istio-applied.yaml"
kctl create namespace istio-system >/dev/null
kctl apply --server-side -f "$IK_ROOT/manifests/istio-applied.yaml" > "$IK_ROOT/logs/apply.log"
svc_slice istio-system istiod "$KN_NODE_IP" "grpc-xds:15010:TCP https-dns:15012:TCP https-webhook:15017:TCP http-monitoring:15014:TCP" \
  | kctl apply -f - >/dev/null
log "applied Istio's manifests (minus istiod's Deployment); istiod Service -> $KN_NODE_IP"

# --- istiod ------------------------------------------------------------------------------
# Its ServiceAccount's token, so istiod acts with the chart's RBAC.
token=$(kctl -n istio-system create token istiod --duration=48h)
cat > "$IK_ROOT/istiod.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: kubenode
  cluster: {server: "https://$KN_NODE_IP:6443", certificate-authority: "$P/ca.crt"}
users:
- name: istiod
  user: {token: "$token"}
contexts:
- name: kubenode
  context: {cluster: kubenode, user: istiod, namespace: istio-system}
current-context: kubenode
KC
# The Deployment's own env (literal values) and args.
dep=$(yq 'select(. != null) | select(.kind == "Deployment" and .metadata.name == "istiod") | .spec.template.spec.containers[0]' "$m")
jq -r '.env[] | select(.value != null) | "\(.name)=\(.value)"' <<<"$dep" > "$IK_ROOT/istiod.env"
jq -r '.args[]' <<<"$dep" > "$IK_ROOT/istiod.args"
start_istiod
# Ready for pods once the webhook carries istiod's CA (istiod patches it) and the
# apiserver reaches it through the Service.
has_ca() { [ -n "$(kctl get mutatingwebhookconfiguration istio-sidecar-injector -o jsonpath='{.webhooks[0].clientConfig.caBundle}')" ]; }
wait_for istiod/webhook-ca 60 has_ca
wait_for istiod/webhook-via-service 30 kn curl -sk -o /dev/null "https://$(kctl -n istio-system get svc istiod -o jsonpath='{.spec.clusterIP}'):443/inject" -X POST -H 'Content-Type: application/json' -d '{}'
log "istio up: istiod $KN_NODE_IP (15010 15012 15017 8080 15014), injector webhook registered, kube-dns 10.96.0.10"
