#!/usr/bin/env bash
# The chart as an archive to install from: checks that its README (values table generated from
# values.schema.json and values.yaml by hack/chart-readme.py) is current, then `helm package`.
#
# usage: hack/package-chart.sh [OUT_DIR]   (default ./dist; prints the archive's path)
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/python.sh"
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then sed -n '2,5p' "$0"; exit 0; fi
tl::py::ensure >&2
out="${1:-dist}"
"${TL_VENV}/bin/python" "${TL_HACK}/chart-readme.py" --check
helm="$(tl::bin_path helm)"
[[ -x "${helm}" ]] || "${TL_HACK}/build-binaries.sh" helm >&2
mkdir -p "${out}"
"${helm}" package "${TL_ROOT}/manifests/charts/tidelease" --destination "${out}" |
  sed -n 's/^Successfully packaged chart and saved it to: //p'
