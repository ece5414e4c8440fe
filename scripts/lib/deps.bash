# Sourced by scripts/test and scripts/demo (bash). Makes sure what a build needs is installed:
#   gpipe_ensure_deps [benchmark]
# Checks cmake (>= 3.25), ninja, g++, doctest, oneDNN (libdnnl) and, when asked (the test
# setup), Google Benchmark, Doxygen, OpenBLAS and Open MPI. What is missing is installed with
# apt-get when we are root or have passwordless sudo; otherwise the function names the packages
# and returns 1. The test setup also installs ccache (the compiler cache of the build,
# cmake/gpipeCompilerCache.cmake) where it may; without it the build is the same, only colder.

_gpipe_links() {  # _gpipe_links <source> [link flags...]: true when g++ compiles and links it
  local source=$1
  shift
  command -v g++ >/dev/null 2>&1 &&
    printf '%s\n' "$source" | g++ -std=c++20 -x c++ - -o /dev/null "$@" >/dev/null 2>&1
}

_gpipe_has_library() {  # _gpipe_has_library <soname>: true when the dynamic loader knows it
  local listing
  listing=$({ ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null) || true
  [[ $listing == *$'\t'"$1 "* ]]
}

_gpipe_missing_packages() {
  local want_benchmark=$1
  local missing=()
  command -v cmake >/dev/null 2>&1 || missing+=(cmake)
  command -v ninja >/dev/null 2>&1 || missing+=(ninja-build)
  command -v g++ >/dev/null 2>&1 || missing+=(g++)
  _gpipe_links $'#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN\n#include <doctest/doctest.h>' ||
    missing+=(doctest-dev)
  _gpipe_links $'#include <oneapi/dnnl/dnnl.h>\nint main() { return dnnl_version() == nullptr; }' \
    -ldnnl || missing+=(libdnnl-dev)
  if [[ $want_benchmark == 1 ]]; then
    _gpipe_links $'#include <benchmark/benchmark.h>\nint main() {}' -lbenchmark -pthread ||
      missing+=(libbenchmark-dev)
    # CTest api_reference builds the API reference from the headers (Doxygen)
    command -v doxygen >/dev/null 2>&1 || missing+=(doxygen)
    # OpenBLAS, the host GEMM's second library (loaded at run time, gemm_library.hpp): its tests
    # run where it is installed, and it is the default GEMM on AMD Zen CPUs
    _gpipe_has_library libopenblas.so.0 || missing+=(libopenblas0-pthread)
    # the MPI backend's tests run under mpirun (Open MPI)
    if ! command -v mpicxx >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
      missing+=(libopenmpi-dev openmpi-bin)
    fi
  fi
  if ((${#missing[@]} > 0)); then printf '%s\n' "${missing[@]}"; fi
}

# The packages that make the test setup faster or more complete but are not needed: installed
# only where apt-get may run, never an error.
_gpipe_optional_packages() {
  command -v ccache >/dev/null 2>&1 || echo ccache
  # PyTorch, the reference of tests/pytorch (skipped without it): Debian's, for the system Python.
  local python
  for python in python3 /usr/bin/python3; do
    command -v "$python" >/dev/null 2>&1 && "$python" -c "import torch" >/dev/null 2>&1 && return
  done
  echo python3-torch
}

# The sudo prefix for apt-get (empty as root) in the array `sudo`; false when apt-get may not run.
_gpipe_may_install() {
  sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null || return 1
    sudo=(sudo -n)
  fi
  command -v apt-get >/dev/null 2>&1
}

gpipe_ensure_deps() {
  local want_benchmark=0
  [[ ${1:-} == benchmark ]] && want_benchmark=1
  local missing optional sudo
  mapfile -t missing < <(_gpipe_missing_packages "$want_benchmark")
  optional=()
  if [[ $want_benchmark == 1 ]] && _gpipe_may_install; then
    mapfile -t optional < <(_gpipe_optional_packages)
    if ((${#optional[@]} > 0 && ${#missing[@]} == 0)); then
      echo "gpipe: installing ${optional[*]} (optional)"
      "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "${optional[@]}" >/dev/null 2>&1 ||
        { "${sudo[@]}" apt-get update >/dev/null 2>&1 &&
          "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y \
            --no-install-recommends "${optional[@]}" >/dev/null 2>&1; } ||
        echo "gpipe: could not install ${optional[*]}; building without it"
      optional=()
    fi
  fi

  if ((${#missing[@]} > 0)); then
    local sudo=()
    if ((EUID != 0)); then
      if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo=(sudo -n)
      else
        echo "gpipe: missing packages: ${missing[*]}" >&2
        echo "gpipe: install them with: sudo apt-get install ${missing[*]}" >&2
        return 1
      fi
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
      echo "gpipe: missing, and no apt-get to install them: ${missing[*]} (Debian package names)" >&2
      return 1
    fi
    echo "gpipe: installing ${missing[*]}"
    "${sudo[@]}" apt-get update
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      "${missing[@]}"
    if ((${#optional[@]} > 0)); then
      "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y \
        --no-install-recommends "${optional[@]}" ||
        echo "gpipe: could not install ${optional[*]}; building without it"
    fi
    mapfile -t missing < <(_gpipe_missing_packages "$want_benchmark")
    if ((${#missing[@]} > 0)); then
      echo "gpipe: still missing after apt-get install: ${missing[*]}" >&2
      return 1
    fi
  fi

  local version
  version=$(cmake --version | sed -n 's/^cmake version \([0-9]*\.[0-9]*\).*/\1/p')
  if ! printf '3.25\n%s\n' "$version" | sort -V -C; then
    echo "gpipe: cmake $version is too old, 3.25 or newer is needed (Debian 12 has it;" \
      "elsewhere: pip install cmake, or Kitware's apt repository)" >&2
    return 1
  fi
}
