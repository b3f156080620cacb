# shellcheck shell=bash
# The project's Python environment: a virtualenv in .venv with tidelease installed editable, the
# dev tools and the simulator's plots (matplotlib). Created on first use; re-installed when
# pyproject.toml changes.
#
#   source "${TL_HACK}/lib/python.sh"; tl::py::ensure; "${TL_PY}" -m pytest

if [[ -n "${TL_PYTHON_SOURCED:-}" ]]; then
  return 0
fi
TL_PYTHON_SOURCED=1

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

TL_VENV="${TL_VENV:-${TL_ROOT}/.venv}"
TL_PY="${TL_VENV}/bin/python"
TL_PYTHON_BIN="${TL_PYTHON_BIN:-python3}"

tl::py::ensure() {
  tl::require_cmd "${TL_PYTHON_BIN}"
  "${TL_PYTHON_BIN}" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    tl::die "Python 3.11 or newer is needed (found $("${TL_PYTHON_BIN}" --version 2>&1))"
  local stamp="${TL_VENV}/.tidelease-installed"
  if [[ -x "${TL_PY}" && -f "${stamp}" && "${stamp}" -nt "${TL_ROOT}/pyproject.toml" ]]; then
    return 0
  fi
  local start
  start="$(tl::now_s)"
  tl::log "setting up ${TL_VENV} (first run, or pyproject.toml changed)"
  [[ -x "${TL_PY}" ]] || "${TL_PYTHON_BIN}" -m venv "${TL_VENV}"
  "${TL_PY}" -m pip install --quiet --disable-pip-version-check --upgrade pip
  "${TL_PY}" -m pip install --quiet --disable-pip-version-check -e "${TL_ROOT}[dev,plots]"
  touch "${stamp}"
  tl::log "Python environment ready in $(tl::elapsed "${start}") s"
}
