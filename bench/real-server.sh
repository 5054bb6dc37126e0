#!/usr/bin/env bash
# `rbac-rules-bench` against the local real control plane of
# ../shared/testbed (etcd, kube-apiserver, kube-controller-manager, no
# nodes): wipes it (up.sh --fresh), then runs every phase with the
# controller phases on the real server; the forced relist restarts the
# control plane (down.sh, up.sh) under the running controller.
#
#   bench/real-server.sh [SCENARIO] [more bench flags...]
#
# SCENARIO: small (default), large or xl. TB: the testbed directory
# (default ~/rbac-rules-testbed). RBAC_RULES: the bench binary (default
# target/release/rbac-rules-bench, rbac-rules beside it: timings and
# memory of a debug build are not the product's). Prints the JSON report on stdout; progress on stderr.
set -euo pipefail
TB=${TB:-$HOME/rbac-rules-testbed}
BIN=${RBAC_RULES:-$(cd "$(dirname "$0")/.." && pwd)/target/release/rbac-rules-bench}
SCENARIO=${1:-small}
shift || true
"$TB/up.sh" --fresh >&2
exec "$BIN" --scenario "$SCENARIO" --json \
  --kubeconfig "$TB/admin.kubeconfig" \
  --relist-command "$TB/down.sh >/dev/null && $TB/up.sh >/dev/null" "$@"
