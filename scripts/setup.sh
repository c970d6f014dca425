#!/usr/bin/env bash
# Idempotent set-up shared by the README's two commands and CI: system packages, the Python venv
# (torch and the test models), and the CMake build. Each step is skipped when already satisfied, so
# a second run only rebuilds what changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Outside the checkout, so that fresh clones (CI) reuse it; rebuilt when requirements change.
VENV="${ATTNREPLAY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/attnreplay/venv}"
BUILD="${ATTNREPLAY_BUILD:-$ROOT/build}"
log() { printf '[setup] %s\n' "$*" >&2; }

# chromium-headless-shell: the browser the HTML report's test opens it in (tests/e2e/test_html_report.py);
# libpng-dev, libjpeg-dev: the images `attnreplay e2e` compares (formats/image_file.h).
APT_PACKAGES=(cmake ninja-build g++ libhdf5-dev libcli11-dev libfmt-dev nlohmann-json3-dev catch2 python3-venv
              chromium-headless-shell libpng-dev libjpeg-dev)

have_all_apt() {
  local p
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || return 1
  done
  # Catch2 v3 (bookworm's own is v2).
  [ -f /usr/lib/cmake/Catch2/Catch2Config.cmake ] || [ -f /usr/lib/x86_64-linux-gnu/cmake/Catch2/Catch2Config.cmake ] || return 1
}

# Catch2 v3 lives in bookworm-backports. The new source entry is the existing Debian entry with
# only its suite changed, so no mirror host is named here.
add_backports() {
  local src=/etc/apt/sources.list.d/debian.sources dst=/etc/apt/sources.list.d/attnreplay-backports.sources
  [ -f "$dst" ] && return 0
  if [ -f "$src" ]; then
    awk 'BEGIN{RS="";ORS="\n\n"} /Suites:[^\n]*bookworm([ \n]|$)/ && !/security/ {
           sub(/Suites:[^\n]*/, "Suites: bookworm-backports"); print; exit }' "$src" > "$dst"
  elif [ -f /etc/apt/sources.list ]; then
    grep -E '^deb .* bookworm main' /etc/apt/sources.list | head -n1 |
      sed 's/ bookworm main/ bookworm-backports main/' > /etc/apt/sources.list.d/attnreplay-backports.list
    dst=/etc/apt/sources.list.d/attnreplay-backports.list
  fi
  [ -s "$dst" ] || { log "could not derive a bookworm-backports entry from the apt sources"; rm -f "$dst"; return 1; }
}

install_apt() {
  have_all_apt && return 0
  command -v apt-get >/dev/null || { log "missing system packages and no apt-get: install ${APT_PACKAGES[*]} (Catch2 v3)"; exit 1; }
  local sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  if grep -qs bookworm /etc/os-release; then $sudo bash -c "$(declare -f add_backports log); add_backports"; fi
  log "installing system packages"
  $sudo apt-get update -qq
  local pkgs=("${APT_PACKAGES[@]}")
  if grep -qs bookworm /etc/os-release; then
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports catch2 >/dev/null
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
}

# Python side: torch pinned to the GPU machine's version, so one code base builds on both.
PY_REQUIREMENTS="$ROOT/scripts/requirements.txt"
PY_NO_DEPS_REQUIREMENTS="$ROOT/scripts/requirements-no-deps.txt"
install_venv() {
  local stamp="$VENV/.attnreplay-requirements"
  if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && cat "$PY_REQUIREMENTS" "$PY_NO_DEPS_REQUIREMENTS" | cmp -s "$stamp" -; then
    return 0
  fi
  log "creating the Python venv at $VENV (torch and test models; several minutes the first time)"
  mkdir -p "$(dirname "$VENV")"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r "$PY_REQUIREMENTS"
  "$VENV/bin/python" -m pip install -q --no-deps -r "$PY_NO_DEPS_REQUIREMENTS"
  cat "$PY_REQUIREMENTS" "$PY_NO_DEPS_REQUIREMENTS" > "$stamp"
}

# A second venv with an older torch and another Python (3.10 where pyenv has it: the oldest that
# the test models install on, and older than 3.11's frame API), where the tests run users' jobs
# under the preload (tests/e2e/test_capture_other_torch.py).
OTHER_VENV="${ATTNREPLAY_OTHER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/attnreplay/venv-other-torch}"
OTHER_REQUIREMENTS="$ROOT/scripts/requirements-other-torch.txt"
install_other_venv() {
  local stamp="$OTHER_VENV/.attnreplay-requirements" python
  python="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.10*/bin/python3.10 2>/dev/null | tail -n1 || true)"
  [ -x "$python" ] || python=python3
  if [ -x "$OTHER_VENV/bin/python" ] && [ -f "$stamp" ] && cmp -s "$stamp" "$OTHER_REQUIREMENTS" &&
     [ "$("$OTHER_VENV/bin/python" --version)" = "$("$python" --version)" ]; then
    return 0
  fi
  # Another Python than the venv's: start it afresh.
  [ ! -x "$OTHER_VENV/bin/python" ] || [ "$("$OTHER_VENV/bin/python" --version)" = "$("$python" --version)" ] ||
    rm -rf "$OTHER_VENV"
  log "creating the second venv at $OTHER_VENV ($("$python" --version), an older torch; minutes the first time)"
  mkdir -p "$(dirname "$OTHER_VENV")"
  [ -x "$OTHER_VENV/bin/python" ] || "$python" -m venv "$OTHER_VENV"
  "$OTHER_VENV/bin/python" -m pip install -q --upgrade pip
  "$OTHER_VENV/bin/python" -m pip install -q -r "$OTHER_REQUIREMENTS"
  cp "$OTHER_REQUIREMENTS" "$stamp"
}

configure_and_build() {
  local torch_prefix generator=()
  torch_prefix="$("$VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
  command -v ninja >/dev/null && generator=(-G Ninja)
  if [ ! -f "$BUILD/CMakeCache.txt" ] || ! grep -qs "^Python3_EXECUTABLE:.*=$VENV/bin/python$" "$BUILD/CMakeCache.txt"; then
    log "configuring $BUILD"
    # A cache made with another venv remembers that venv's torch: start it afresh.
    rm -f "$BUILD/CMakeCache.txt"
    cmake -S "$ROOT" -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$torch_prefix" -DPython3_EXECUTABLE="$VENV/bin/python" >/dev/null
  fi
  # What is built: the demo's and an install's targets, or (with targets "all") the tests too.
  local targets=("$@")
  [ ${#targets[@]} -gt 0 ] || targets=(attnreplay attncap attncap_torch)
  log "building ${targets[*]} (${ATTNREPLAY_JOBS:-2} jobs)"
  cmake --build "$BUILD" -j "${ATTNREPLAY_JOBS:-2}" --target "${targets[@]}"
  link_binaries
  # A tree that works from anywhere (docs/capture.md), when asked for.
  if [ -n "${ATTNREPLAY_PREFIX:-}" ]; then
    log "installing into $ATTNREPLAY_PREFIX"
    cmake --install "$BUILD" --prefix "$ATTNREPLAY_PREFIX" > /dev/null
  fi
}

# `attnreplay` where a user looks for it: linked into ~/.local/bin (ATTNREPLAY_BIN_DIR moves it;
# "none" leaves it alone), which most shells already have on PATH.
BIN_DIR="${ATTNREPLAY_BIN_DIR:-$HOME/.local/bin}"
link_binaries() {
  [ "$BIN_DIR" = none ] && return 0
  mkdir -p "$BIN_DIR"
  ln -sfn "$BUILD/replay/attnreplay" "$BIN_DIR/attnreplay"
  ln -sfn "$BUILD/bin/attnreplay-capture-build" "$BIN_DIR/attnreplay-capture-build"
  case ":$PATH:" in
    *":$BIN_DIR:"*) log "attnreplay is $BUILD/replay/attnreplay, linked as $BIN_DIR/attnreplay" ;;
    *) log "attnreplay is $BUILD/replay/attnreplay, linked as $BIN_DIR/attnreplay; $BIN_DIR is not on PATH: export PATH=\"$BIN_DIR:\$PATH\"" ;;
  esac
}

# Other scripts source this file for its paths and functions.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

step="${1:-all}"
case "$step" in
  deps) install_apt; install_venv ;;
  build) configure_and_build all ;;
  all) install_apt; install_venv; configure_and_build ;;
  tests) install_apt; install_venv; install_other_venv; configure_and_build all ;;
  *) log "usage: setup.sh [deps|build|all|tests]"; exit 2 ;;
esac
