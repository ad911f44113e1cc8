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
          libimgui-dev libglfw3-dev libgl-dev libstb-dev xvfb xauth libgl1-mesa-dri libglx-mesa0
          # the Python module (python/) and its tests: pybind11, numpy and pytest for Debian's python3
          python3-dev pybind11-dev python3-pybind11 python3-numpy python3-pytest
          # the Redis prefix store (`--store redis:...`): the hiredis client, and the server its
          # tests start on a Unix socket of their own
          libhiredis-dev redis-server
          # the sanitized build and the fuzz targets (build-san): clang with its sanitizer and
          # libFuzzer runtimes, and its OpenMP
          clang libclang-rt-14-dev libomp-dev
          # the Debian package (`cpack -G DEB`) and its dependencies read from the binaries;
          # groff and zsh check the man pages and the zsh completion script
          dpkg-dev file groff-base zsh)
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
  # -LE slow: the exhaustive checks (all 2^32 fp32 inputs) run on request, `ctest -L slow`.
  # KVLAB_THREADS=1: a kvlab a test starts runs one thread (--threads auto), as ctest counts it;
  # the tests that run more say so (tests/CMakeLists.txt: THREADS, PROCESSORS).
  export KVLAB_THREADS=1
  ctest --test-dir build --output-on-failure -j "$(nproc)" -LE slow

  # Hardening (README "Fuzzing and sanitizers"): the suite again, built by clang with
  # AddressSanitizer and UndefinedBehaviorSanitizer into build-san, then the fuzz targets for
  # KVLAB_FUZZ_SECONDS each (default 20), one per core. Left out under the sanitizers: tests/limits.sh, whose
  # `ulimit -v` leaves no room for ASan's shadow memory (it runs in build/); the Coq proofs,
  # which compile no C++; and two numeric searches at large sizes (verify's long profile, 8192
  # positions, and six 200-step demos on stories260K) that take 10 of CI's minutes under ASan and
  # run, above, in build/: their code runs under the sanitizers at small sizes in the other tests.
  CXX=clang++ cmake -S . -B build-san -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DKVLAB_SANITIZE=ON -DKVLAB_WITH_CUDA=OFF
  cmake --build build-san -j "$(nproc)"
  (
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp"
    # Mesa's driver stays mapped, so LeakSanitizer still scans its globals (tests/lsan.supp says why).
    driver=$(ls /usr/lib/*/dri/swrast_dri.so 2>/dev/null | head -1)
    if [ -n "$driver" ]; then export LD_PRELOAD="$driver"; fi
    ctest --test-dir build-san --output-on-failure -j "$(nproc)" -LE slow \
      -E '^(limits|proofs)[:,] |^verify --profile long |^kvlab demo --kv-format on stories260K'
  )
  fuzz/run.sh build-san "${KVLAB_FUZZ_SECONDS:-20}"
fi
