#!/usr/bin/env bash
# Generate the Python modules of the kubelet device plugin API (deviceplugin v1beta1), the CRI
# subset (runtime.v1), the DRA kubelet plugin API (dra v1) and plugin registration from the
# protos below, with grpcio-tools: NAME_pb2.py, NAME_pb2.pyi, NAME_pb2_grpc.py next to NAME.proto.
# The generated files are committed; tests/unit/test_deviceplugin_proto.py fails when stale.
#
# usage: hack/gen-proto.sh [OUT_ROOT]
#   OUT_ROOT   root the modules are written under (default: the checkout), at the protos' own
#              paths, e.g. OUT_ROOT/nodeagent/dradriver/registration_pb2.py
#   PYTHON     interpreter with grpcio-tools (default: .venv/bin/python of the checkout)
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

PYTHON="${PYTHON:-${TL_ROOT}/.venv/bin/python}"
PROTOS=(
  nodeagent/deviceplugin/api.proto
  nodeagent/cri/api.proto
  nodeagent/dradriver/api.proto
  nodeagent/dradriver/registration.proto
)

usage() { sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then usage; exit 0; fi
if [[ $# -gt 1 ]]; then usage >&2; exit 2; fi

OUT_ROOT="${1:-${TL_ROOT}}"

[[ -x "${PYTHON}" ]] || tl::die "no Python at ${PYTHON} (run hack/test.sh once, or set PYTHON)"
"${PYTHON}" -c 'import grpc_tools.protoc' 2>/dev/null ||
  tl::die "${PYTHON} lacks grpcio-tools (pip install -e '.[dev]')"
for proto in "${PROTOS[@]}"; do
  [[ -f "${TL_ROOT}/${proto}" ]] || tl::die "missing ${TL_ROOT}/${proto}"
done

# The include root is the checkout, so each generated gRPC module imports its messages as
# `from nodeagent.deviceplugin import api_pb2`: an absolute import that works from anywhere.
cd "${TL_ROOT}"
for proto in "${PROTOS[@]}"; do
  mkdir -p "${OUT_ROOT}/$(dirname "${proto}")"
  "${PYTHON}" -m grpc_tools.protoc \
    --proto_path=. \
    --python_out="${OUT_ROOT}" \
    --pyi_out="${OUT_ROOT}" \
    --grpc_python_out="${OUT_ROOT}" \
    "${proto}"
  # pyproject.toml exempts deviceplugin's modules from ruff and mypy by name; later protos'
  # modules carry the exemption themselves, as file-level pragmas.
  if [[ "${proto}" != nodeagent/deviceplugin/* ]]; then
    for out in "${OUT_ROOT}/${proto%.proto}"_pb2{.py,.pyi,_grpc.py}; do
      { printf '# ruff: noqa\n# fmt: off\n# mypy: ignore-errors\n'; cat "${out}"; } >"${out}.tmp"
      mv "${out}.tmp" "${out}"
    done
  fi
  tl::log "generated ${OUT_ROOT}/${proto%.proto}_pb2{.py,.pyi,_grpc.py}"
done
