#!/usr/bin/env bash
# istio-down.sh — stops what istio-up.sh started (by PID). Safe to run twice;
# the kube peer's down.sh removes the rest (iptables rules die with the netns).
# `istio-down.sh istiod` stops istiod only (the suite's outage check).
set -uo pipefail
. "$(dirname "$0")/common.sh"
alive() { local st; st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1; [ -n "$st" ] && [ "${st%% *}" != Z ]; }
names=(istiod coredns kube-proxy)
[ "${1:-}" = istiod ] && names=(istiod)
for n in "${names[@]}"; do
  f=$IK_ROOT/pids/$n.pid
  [ -f "$f" ] || continue
  pid=$(cat "$f")
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null
    for ((i = 0; i < 100; i++)); do alive "$pid" || break; sleep 0.1; done
    alive "$pid" && kill -KILL "$pid" 2>/dev/null
    echo "[istio-down] stopped $n ($pid)"
  fi
  rm -f "$f"
done
