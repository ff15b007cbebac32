#!/usr/bin/env bash
# Installs what metronome needs on Debian 12 when it is missing: g++ 12, clang 14 (the
# asio-newest preset, clang-tidy's), clang 16 with libc++ (the libcxx preset), CMake,
# Ninja, Boost 1.81 (Asio, Boost.Test), standalone Asio 1.22 (the libcxx preset),
# doxygen (the API reference test). Safe to run again; needs root or sudo
# only when something is missing.
set -euo pipefail
need=()
for pkg in g++ clang-14 clang-16 libc++-16-dev libc++abi-16-dev cmake ninja-build libboost1.81-dev libboost-test1.81-dev libasio-dev doxygen; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "metronome: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  # No recommends: libasio-dev's (libboost-dev, Debian's Boost 1.74) would replace Boost 1.81.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
