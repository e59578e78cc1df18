#!/usr/bin/env bash
# Build the C++ kernels with AddressSanitizer + UndefinedBehaviorSanitizer and
# run the kernel tests (and the binding fuzzer) against that build.
#
# Usage:   tools/sanitize.sh [extra pytest arguments]
#          PYTHON=/path/to/python tools/sanitize.sh -x -q
#
# What it does:
#   1. configures and builds the `_core` extension into build-sanitize/ (never
#      touching the normal build or the installed package) with
#      -fsanitize=address,undefined -fno-sanitize-recover=undefined, so any
#      out-of-bounds access, use-after-free or undefined behaviour aborts;
#   2. runs the kernel tests with that `_core` loaded in place of the
#      installed one (a tiny pytest plugin puts it in sys.modules before the
#      tests import specdec_cpu.sampling);
#   3. preloads libasan (LD_PRELOAD): the Python interpreter is not built with
#      ASan, and the ASan runtime must be the first library in the process.
#      The C++ runtime is preloaded right after it, or ASan cannot intercept
#      __cxa_throw (the interpreter does not link libstdc++) and aborts at the
#      first C++ exception.  Leak detection is off: CPython keeps objects
#      alive at exit by design.  Python's fault handler is disabled so that
#      ASan reports a crash itself, with a symbolised stack.
#      detect_stack_use_after_return stays off: with it GCC 12 crashes in the
#      AVX-512 kernels, having turned an unaligned store into a local
#      float[16] into an aligned one (vmovaps) that assumes 64-byte stack
#      alignment, which ASan's substitute stack frames do not provide.
#
# Needs: a C++ compiler with libasan/libubsan (GCC or Clang), cmake, and a
# Python environment with specdec_cpu installed plus pybind11, numpy, pytest
# and hypothesis.  Exit status: pytest's (non-zero on any sanitizer report).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
CXX="${CXX:-c++}"
BUILD="${SANITIZE_BUILD_DIR:-$ROOT/build-sanitize}"
FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
TESTS=(tests/test_kernels_properties.py tests/test_kernels_reference.py
       tests/test_exactness_kernels.py tests/test_fuzz_bindings.py)

LIBASAN="$("$CXX" -print-file-name=libasan.so)"
if [[ ! -e "$LIBASAN" ]]; then
    echo "sanitize.sh: $CXX has no libasan.so (install the compiler's ASan runtime)" >&2
    exit 2
fi
LIBSTDCXX="$("$CXX" -print-file-name=libstdc++.so.6)"
PYBIND11_DIR="$("$PYTHON" -c 'import pybind11; print(pybind11.get_cmake_dir())')"

echo "== building _core with $FLAGS into $BUILD"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER="$CXX" \
    -DCMAKE_CXX_FLAGS="$FLAGS" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DPython_EXECUTABLE="$("$PYTHON" -c 'import sys; print(sys.executable)')" \
    -Dpybind11_DIR="$PYBIND11_DIR" >/dev/null
cmake --build "$BUILD" --target _core -j "$(nproc 2>/dev/null || echo 2)"
CORE="$(ls "$BUILD"/_core*.so | head -n 1)"

# The plugin that swaps the sanitized _core in.
mkdir -p "$BUILD/plugin"
cat > "$BUILD/plugin/specdec_sanitized_core.py" <<PY
import importlib.util, sys
import specdec_cpu
_spec = importlib.util.spec_from_file_location("specdec_cpu._core", "$CORE")
_core = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_core)
sys.modules["specdec_cpu._core"] = _core
specdec_cpu._core = _core

def pytest_report_header(config):
    return "sanitized kernels: " + _core.__file__
PY

echo "== running the kernel tests under ASan/UBSan ($CORE)"
cd "$ROOT"
export LD_PRELOAD="$LIBASAN $LIBSTDCXX${LD_PRELOAD:+ $LD_PRELOAD}"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:strict_string_checks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export PYTHONPATH="$BUILD/plugin${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -c "
import specdec_sanitized_core, specdec_cpu.sampling as s
assert s._core.__file__ == '$CORE', s._core.__file__
print('kernels loaded from', s._core.__file__, '- ISAs:', s.supported_isas())
"
exec "$PYTHON" -m pytest -p specdec_sanitized_core -p no:cacheprovider -p no:faulthandler "${TESTS[@]}" "$@"
