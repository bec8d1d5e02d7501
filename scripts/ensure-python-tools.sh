#!/usr/bin/env bash
# Installs the PyPI tools the tests use when any is missing, at the versions they were checked
# with: moto's server (a real emulator of the AWS ECR API) and the AWS CLI, which the fill job
# calls with --ecr. Used by `make deps`, so that a fresh machine needs no step done by hand.
set -euo pipefail
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
wanted=("moto[server]==5.1.22" "awscli==1.45.11")
if command -v moto_server >/dev/null && command -v aws >/dev/null \
    && python3 -c 'import importlib.metadata as m; assert m.version("moto") == "5.1.22" and m.version("awscli") == "1.45.11"' 2>/dev/null; then
  exit 0
fi
echo "installing from PyPI: ${wanted[*]}" >&2
python3 -m pip install --quiet "${wanted[@]}" >&2
command -v moto_server >/dev/null && command -v aws >/dev/null || {
  echo "error: moto_server or aws is not on PATH after pip install (PATH=$PATH)" >&2
  exit 1
}
