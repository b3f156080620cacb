#!/usr/bin/env bash
# Generate the Python modules of the kubelet device plugin API (deviceplugin v1beta1) from
# nodeagent/deviceplugin/api.proto with grpcio-tools: api_pb2.py, api_pb2.pyi, api_pb2_grpc.py.
# The generated files are committed; tests/unit/test_deviceplugin_proto.py fails when stale.
#
# usage: hack/gen-proto.sh [OUT_ROOT]
#   OUT_ROOT   root the modules are written under (default: the checkout), as
#              OUT_ROOT/nodeagent/deviceplugin/api_pb2*.py
#   PYTHON     interpreter with grpcio-tools (default: .venv/bin/python of the checkout)
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

PYTHON="${PYTHON:-${TL_ROOT}/.venv/bin/python}"
PROTO="nodeagent/deviceplugin/api.proto"

usage() { sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then usage; exit 0; fi
if [[ $# -gt 1 ]]; then usage >&2; exit 2; fi

OUT_ROOT="${1:-${TL_ROOT}}"

[[ -x "${PYTHON}" ]] || tl::die "no Python at ${PYTHON} (run hack/test.sh once, or set PYTHON)"
"${PYTHON}" -c 'import grpc_tools.protoc' 2>/dev/null ||
  tl::die "${PYTHON} lacks grpcio-tools (pip install -e '.[dev]')"
[[ -f "${TL_ROOT}/${PROTO}" ]] || tl::die "missing ${TL_ROOT}/${PROTO}"

mkdir -p "${OUT_ROOT}/$(dirname "${PROTO}")"
# The include root is the checkout, so the generated gRPC module imports its messages as
# `from nodeagent.deviceplugin import api_pb2`: an absolute import that works from anywhere.
cd "${TL_ROOT}"
"${PYTHON}" -m grpc_tools.protoc \
  --proto_path=. \
  --python_out="${OUT_ROOT}" \
  --pyi_out="${OUT_ROOT}" \
  --grpc_python_out="${OUT_ROOT}" \
  "${PROTO}"
tl::log "generated ${OUT_ROOT}/${PROTO%.proto}_pb2{.py,.pyi,_grpc.py}"
