#!/usr/bin/env bash
# The main job on its embedded default: an extender serving a built-in GPU cluster, driven over
# HTTP the way kube-scheduler drives it, through a day of tides (lend, borrow, reclaim).
#
# usage: hack/demo.sh
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/python.sh"
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then sed -n '2,5p' "$0"; exit 0; fi
tl::py::ensure >&2
exec "${TL_VENV}/bin/tidelease" --log-level WARNING demo
