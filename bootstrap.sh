#!/usr/bin/env bash
# Set up, build and run kvlab on Debian 12.
#   ./bootstrap.sh demo   install what is missing, build, run `kvlab demo`
#   ./bootstrap.sh test   install what is missing, build, run every test
set -euo pipefail
cd "$(dirname "$0")"

mode=${1:-demo}
case "$mode" in demo|test) ;; *) echo "usage: $0 demo|test" >&2; exit 2 ;; esac

packages=(cmake ninja-build g++ pkg-config coreutils
          libxtensor-dev xtl-dev libxsimd-dev catch2 librapidcheck-dev
          libcli11-dev nlohmann-json3-dev libfmt-dev
          # the machine-checked proofs (proofs/coq): Coq 8.16 and Flocq
          coq libcoq-flocq
          # the viewer: Dear ImGui 1.86 (with its GLFW and OpenGL3 backends), GLFW, OpenGL, stb,
          # and Xvfb with Mesa's software OpenGL for headless pictures and the viewer's tests
          libimgui-dev libglfw3-dev libgl-dev libstb-dev xvfb xauth libgl1-mesa-dri libglx-mesa0)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    echo "kvlab needs these Debian packages. Run:" >&2
    echo "  sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"

if [ "$mode" = demo ]; then
  ./build/kvlab demo
else
  ctest --test-dir build --output-on-failure -j "$(nproc)"
fi
