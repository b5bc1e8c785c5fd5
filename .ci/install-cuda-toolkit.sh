#!/bin/sh
# Installs the CUDA toolkit stheno builds its kernels with: Debian's non-free
# nvidia-cuda-toolkit (CUDA 11.8: nvcc, cuda.h and the libcuda stub to link
# against). Run as root; does nothing when nvcc is already there.
set -eu
if command -v nvcc >/dev/null 2>&1; then
	exit 0
fi
src=/etc/apt/sources.list.d/debian.sources
if [ -f "$src" ]; then
	# deb822 format: add contrib and non-free to every Components line.
	sed -i -E '/^Components:/{/non-free( |$)/!s/$/ contrib non-free/}' "$src"
elif [ -f /etc/apt/sources.list ]; then
	sed -i -E '/^deb /{/non-free( |$)/!s/$/ contrib non-free/}' /etc/apt/sources.list
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends nvidia-cuda-toolkit nvidia-cuda-dev >/dev/null
nvcc --version | tail -n 2
