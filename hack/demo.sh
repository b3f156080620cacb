#!/usr/bin/env bash
# The main job on its embedded default: the cluster simulator on a built-in 10,000-GPU cluster
# and a two-week trace of tides, borrowers and failures. It runs the extender's and the leasing
# controller's own policy code, compares right of return against no return (the plain
# kube-scheduler) and no scaling over seeds 1-3 (each figure a mean with its 95% confidence
# interval), with the standby pool the sweep sized for this cluster (12%); prints the tables and
# writes PNG plots to ./tidelease-sim-out. About 5 minutes on two cores.
# --standby-sweep sizes the pool again (about 9 minutes: docs/simulator.md).
#
# usage: hack/demo.sh [tidelease simulate options]   (e.g. --scale 0.1 --days 3 for a quick look)
#   The extender's own HTTP demo (a day of tides over HTTP on five nodes): .venv/bin/tidelease demo
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/python.sh"
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then sed -n '2,12p' "$0"; exit 0; fi
tl::py::ensure >&2
exec "${TL_VENV}/bin/tidelease" --log-level WARNING simulate --no-standby-sweep "$@"
