#!/usr/bin/env bash
# The aarch64 (NEON) kernels, tested on an x86-64 machine under QEMU user-mode
# emulation. One command; exits non-zero on any failure.
#
# Usage:   tools/test_arm.sh [--no-python] [--all-isas]
#
# On an x86-64 host (on an aarch64 one it just builds and runs step 3's
# program natively):
#   1. installs what it needs from Debian when missing (apt-get, as root):
#      g++-aarch64-linux-gnu and qemu-user-static;
#   2. on an x86-64 host, builds tests/cpp/kernel_tables natively and runs it:
#      the AVX2/AVX-512 tables against the scalar one, with the tolerances
#      the aarch64 run uses;
#   3. cross-compiles the same program for aarch64 (tools/aarch64-linux-gnu.cmake)
#      and runs it under qemu-aarch64: every entry of the NEON table against
#      the scalar table, the pipeline through it, chi-square tests of the
#      residual sampler (tests/cpp/kernel_tables.cpp says what exactly);
#   4. unless --no-python: unpacks an aarch64 Python 3.11 with numpy, scipy
#      and pytest from Debian's arm64 packages into a private directory (they
#      are not installed: an arm64 python3 would replace the host's), builds
#      the extension for aarch64 with the project's CMakeLists.txt, and runs
#      tests/test_kernels_reference.py and tests/test_exactness_kernels.py
#      under QEMU. On the neon path only, plus the SPECDEC_ISA tests (the
#      scalar path is what the x86-64 test suite runs); --all-isas runs
#      every path.
#
# Everything it builds or unpacks goes under build/arm64/ (or
# $SPECDEC_ARM_BUILD_DIR); a second run reuses it. Adding the arm64
# architecture to dpkg (for `apt-get download`) is its one change to the
# system besides the two packages. Timings printed under the emulator are a
# sanity line, not a speed measurement.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${SPECDEC_ARM_BUILD_DIR:-$ROOT/build/arm64}"
JOBS="${SPECDEC_ARM_JOBS:-2}"
PYTHON_TESTS=1
ALL_ISAS=0
for arg in "$@"; do
    case "$arg" in
        --no-python) PYTHON_TESTS=0 ;;
        --all-isas) ALL_ISAS=1 ;;
        *) echo "usage: tools/test_arm.sh [--no-python] [--all-isas]" >&2; exit 2 ;;
    esac
done

START=$SECONDS
step() { echo "== test_arm ($((SECONDS - START)) s): $*"; }
# Runs a command with its output in a log, shown only if it fails.
quiet() {
    local log="$WORK/last-command.log"
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        echo "test_arm.sh: failed: $*" >&2
        return 1
    fi
}
GENERATOR=()
if command -v ninja >/dev/null 2>&1; then GENERATOR=(-G Ninja); fi

# On an aarch64 machine nothing needs emulating: the program runs natively
# (and the regular test suite runs the Python tests on the neon path).
if [ "$(uname -m)" = aarch64 ]; then
    mkdir -p "$WORK"
    step "native aarch64 build of tests/cpp/kernel_tables"
    quiet cmake -S "$ROOT" -B "$WORK/native" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DSPECDEC_BUILD_EXTENSION=OFF -DSPECDEC_BUILD_KERNEL_TESTS=ON
    quiet cmake --build "$WORK/native" -j "$JOBS"
    "$WORK/native/kernel_tables" --require neon
    step "all passed"
    exit 0
fi

# --- 1. host packages -----------------------------------------------------------
APT_UPDATED=0
apt_update() {
    if [ "$APT_UPDATED" = 0 ]; then
        apt-get update -q
        APT_UPDATED=1
    fi
}
need_root() {
    if [ "$(id -u)" != 0 ]; then
        echo "test_arm.sh: needs root to $1 (or do it first yourself)" >&2
        exit 1
    fi
}

missing=()
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || missing+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64-static >/dev/null 2>&1 || command -v qemu-aarch64 >/dev/null 2>&1 \
    || missing+=(qemu-user-static)
if [ ${#missing[@]} -gt 0 ]; then
    step "installing ${missing[*]}"
    need_root "install ${missing[*]}"
    apt_update
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
QEMU="$(command -v qemu-aarch64-static || command -v qemu-aarch64)"
CROSS_RUNTIME=/usr/aarch64-linux-gnu  # the cross toolchain's own libc and libstdc++
mkdir -p "$WORK"

# --- 2. native run of the driver: the x86-64 tables ----------------------------------
if [ "$(uname -m)" = x86_64 ]; then
    step "native build of tests/cpp/kernel_tables (x86-64)"
    quiet cmake -S "$ROOT" -B "$WORK/native" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DSPECDEC_BUILD_EXTENSION=OFF -DSPECDEC_BUILD_KERNEL_TESTS=ON
    quiet cmake --build "$WORK/native" -j "$JOBS"
    step "native run: the x86-64 tables against the scalar one"
    "$WORK/native/kernel_tables"
fi

# --- 3. aarch64 sysroot with Python (Debian's arm64 packages, unpacked) ------------
SYSROOT="$WORK/sysroot"
PYTHON_ARM="$SYSROOT/usr/bin/python3"
ARM64_PACKAGES=(
    libc6:arm64 libgcc-s1:arm64 libstdc++6:arm64
    python3.11-minimal:arm64 libpython3.11-minimal:arm64 libpython3.11-stdlib:arm64
    libexpat1:arm64 zlib1g:arm64 libffi8:arm64 libbz2-1.0:arm64 liblzma5:arm64
    libcrypt1:arm64 libuuid1:arm64 libssl3:arm64
    python3-numpy:arm64 libblas3:arm64 liblapack3:arm64 libgfortran5:arm64
    python3-scipy:arm64 liblbfgsb0:arm64
    libpython3.11-dev:arm64
)
ALL_PACKAGES=(
    pybind11-dev python3-pytest python3-pluggy python3-iniconfig python3-packaging
    python3-py python3-attr
)
if [ "$PYTHON_TESTS" = 1 ]; then
    STAMP="$(printf '%s\n' "${ARM64_PACKAGES[@]}" "${ALL_PACKAGES[@]}" | md5sum | cut -c1-16)"
    if [ "$(cat "$SYSROOT/.packages" 2>/dev/null)" != "$STAMP" ]; then
        step "unpacking an aarch64 Python, numpy, scipy and pytest from Debian's arm64 packages"
        if ! apt-cache show python3.11-minimal:arm64 >/dev/null 2>&1; then
            need_root "add the arm64 architecture to dpkg"
            dpkg --add-architecture arm64
            APT_UPDATED=0
            apt_update
        fi
        rm -rf "$WORK/debs" "$SYSROOT"
        mkdir -p "$WORK/debs" "$SYSROOT"
        download() {
            (cd "$WORK/debs" && apt-get download -q -o APT::Sandbox::User=root \
                "${ARM64_PACKAGES[@]}" "${ALL_PACKAGES[@]}")
        }
        if ! download; then  # stale package lists: refresh once
            APT_UPDATED=0
            apt_update
            download
        fi
        for deb in "$WORK/debs"/*.deb; do dpkg-deb -x "$deb" "$SYSROOT"; done
        # Debian points these at the reference BLAS/LAPACK with update-alternatives.
        ln -sf blas/libblas.so.3 "$SYSROOT/usr/lib/aarch64-linux-gnu/libblas.so.3"
        ln -sf lapack/liblapack.so.3 "$SYSROOT/usr/lib/aarch64-linux-gnu/liblapack.so.3"
        rm -rf "$WORK/debs"
        echo "$STAMP" >"$SYSROOT/.packages"
    fi
    # The aarch64 interpreter behind a wrapper: sys.executable names the
    # wrapper (QEMU's -0), so subprocesses the tests start run emulated too,
    # and CMake can query it like a native Python.
    cat >"$PYTHON_ARM" <<EOF
#!/bin/sh
exec "$QEMU" -L "$SYSROOT" -0 "\$0" "$SYSROOT/usr/bin/python3.11" "\$@"
EOF
    chmod +x "$PYTHON_ARM"
fi

# --- 4. cross build: the driver, and the extension -----------------------------------
CROSS_ARGS=(-DCMAKE_TOOLCHAIN_FILE="$ROOT/tools/aarch64-linux-gnu.cmake" -DCMAKE_BUILD_TYPE=Release
            -DSPECDEC_BUILD_KERNEL_TESTS=ON)
if [ "$PYTHON_TESTS" = 1 ]; then
    CROSS_ARGS+=(-DSPECDEC_BUILD_EXTENSION=ON -DPython_EXECUTABLE="$PYTHON_ARM"
                 -Dpybind11_DIR="$SYSROOT/usr/lib/cmake/pybind11")
    step "cross build for aarch64: tests/cpp/kernel_tables and the extension _core"
else
    CROSS_ARGS+=(-DSPECDEC_BUILD_EXTENSION=OFF)
    step "cross build for aarch64: tests/cpp/kernel_tables"
fi
CROSS="$WORK/cross"
rm -f "$CROSS/CMakeCache.txt"  # options and interpreter may differ from the last run
# The host's compiler flags (CFLAGS, CXXFLAGS, LDFLAGS: .ci/run sets x86-only
# ones on some CPUs) are not for the cross compiler.
quiet env -u CFLAGS -u CXXFLAGS -u LDFLAGS cmake -S "$ROOT" -B "$CROSS" "${GENERATOR[@]}" "${CROSS_ARGS[@]}"
quiet cmake --build "$CROSS" -j "$JOBS"

# --- 5. the driver under QEMU ------------------------------------------------------------
step "aarch64 run under $(basename "$QEMU"): the NEON table against the scalar one"
"$QEMU" -L "$CROSS_RUNTIME" "$CROSS/kernel_tables" --require neon

# --- 6. the kernel test files under QEMU ---------------------------------------------------
if [ "$PYTHON_TESTS" = 1 ]; then
    STAGE="$WORK/stage"
    rm -rf "$STAGE"
    mkdir -p "$STAGE"
    cp -r "$ROOT/python/specdec_cpu" "$STAGE/"
    cp "$CROSS"/_core*.so "$STAGE/specdec_cpu/"
    SELECT=(-k "not scalar or env_var")
    if [ "$ALL_ISAS" = 1 ]; then SELECT=(); fi
    INFO="$(PYTHONPATH="$STAGE" "$PYTHON_ARM" -c '
import platform, numpy
from specdec_cpu import sampling as s
assert platform.machine() == "aarch64" and s.active_isa() == "neon", (platform.machine(), s.active_isa())
print(platform.machine(), "Python", platform.python_version(), "numpy", numpy.__version__,
      "ISAs", s.supported_isas(), "default", s.active_isa())')"
    step "aarch64 Python under QEMU: $INFO"
    step "pytest under QEMU: tests/test_kernels_reference.py tests/test_exactness_kernels.py ${SELECT[*]}"
    (cd "$ROOT" && PYTHONPATH="$STAGE" PYTHONDONTWRITEBYTECODE=1 "$PYTHON_ARM" -m pytest -q -p no:cacheprovider \
        tests/test_kernels_reference.py tests/test_exactness_kernels.py "${SELECT[@]}")
fi

step "all passed"
