# The Debian package: `cpack -G DEB` in the build folder writes kvlab_<version>_<arch>.deb with
# everything `cmake --install` installs, under /usr. Its Depends are read from the binaries
# (dpkg-shlibdeps), so they name exactly the Debian libraries kvlab links; what the binaries do
# not show (the Python module's numpy, the tools that build against kvlab::core) is declared here.
# A build with KVLAB_NATIVE (the default) runs only on CPUs like the build machine's: configure a
# package for other machines with -DKVLAB_NATIVE=OFF.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvlab)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "KV-cache testbed: naive and cached transformer decode, bitwise equal")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "kvlab maintainers")
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "A tiny Llama-style transformer decoded two ways, naive and with a KV cache, on the CPU and with
CUDA on the GPU, with property tests that every exact cache variant gives bitwise equal logits.
Includes the kvlab program, the kvlab::core library with its headers (find_package and
pkg-config), the cache plugin ABI, the Python module, man pages, completions and the course.")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
if(KVLAB_PYTHON)  # the module is built for this python3's minor version
  math(EXPR kvlab_py_next "${Python3_VERSION_MINOR} + 1")
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "python3 (>= ${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}), python3 (<< ${Python3_VERSION_MAJOR}.${kvlab_py_next}), python3-numpy")
endif()
# Building against kvlab::core or kvlab.pc needs these; running kvlab does not.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libfmt-dev, libhiredis-dev, cmake | pkg-config, g++")
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)  # fast to build in the tests; xz saves little on binaries
include(CPack)
