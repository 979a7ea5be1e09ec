# CMake toolchain file: cross-build for 64-bit ARM Linux with Debian's cross compiler
# (apt-get install g++-aarch64-linux-gnu). See docs/deploy.md, "Cross-building for aarch64".
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
