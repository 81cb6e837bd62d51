#!/usr/bin/env bash
# Build the attnres custom OPP package (custom_opp_<os>_<arch>.run) with an installed CANN toolkit.
#   cann_package/build.sh [build dir]          default build dir: build/cann-package
# Needs: the CANN toolkit (ASCEND_HOME_PATH, or set_env.sh at a default install path), cmake >= 3.16, and a
# Python with attnres-ge installed (ATTNRES_PYTHON, default python3) to generate the REG_OP headers.
# This script is not run by the test suite (no toolkit there); see docs/ascend.md.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build_dir=${1:-"$here/../build/cann-package"}

if [ -z "${ASCEND_HOME_PATH:-}" ]; then
  for env_script in /usr/local/Ascend/ascend-toolkit/set_env.sh "$HOME/Ascend/ascend-toolkit/set_env.sh"; do
    if [ -f "$env_script" ]; then
      # shellcheck disable=SC1090
      source "$env_script"
      break
    fi
  done
fi
if [ -z "${ASCEND_HOME_PATH:-}" ]; then
  echo "cann_package/build.sh: no CANN toolkit found; source <toolkit>/set_env.sh (sets ASCEND_HOME_PATH)" >&2
  exit 1
fi

cmake -S "$here" -B "$build_dir" -DATTNRES_PYTHON="${ATTNRES_PYTHON:-python3}"
cmake --build "$build_dir" -j "$(nproc 2>/dev/null || echo 2)"
cmake --build "$build_dir" --target package
ls "$build_dir"/custom_opp_*.run
