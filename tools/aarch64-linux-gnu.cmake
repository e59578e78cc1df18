# CMake toolchain for building the kernels and the extension for aarch64 with
# Debian's cross compiler (g++-aarch64-linux-gnu); used by tools/test_arm.sh.
#
# CMAKE_CROSSCOMPILING is left FALSE on purpose: the Python given as
# Python_EXECUTABLE is the aarch64 interpreter behind a wrapper script that
# runs it under QEMU, so FindPython and pybind11 can query it as they would a
# native one (extension suffix, include directories). Nothing else in the
# project runs target programs at configure time.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_CROSSCOMPILING FALSE)
