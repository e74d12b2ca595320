#!/usr/bin/env bash
# System and Python packages that hetu needs, on Debian/Ubuntu. Idempotent.
set -euo pipefail
APT_PACKAGES=(build-essential cmake ninja-build pkg-config
  libzmq3-dev libsodium-dev protobuf-compiler libprotobuf-dev
  openmpi-bin libopenmpi-dev libucx-dev
  iproute2 openssh-server openssh-client
  prometheus    # the serving endpoint's metrics are scraped by a real Prometheus in its test
  slurmctld slurmd slurm-client munge   # the Slurm launcher's test submits to a real local Slurm
  xfsprogs      # the disk tier's checkpoint clones are tested on a loop-mounted XFS with reflinks
  fuse libfuse2)   # ... and its I/O errors on a FUSE file system (hetu_tools.fault_fs, fusepy)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
python3 -m pip install -q "scikit-build-core>=0.8" "pybind11>=2.11" numpy pyyaml tqdm mpi4py pytest pytest-timeout matplotlib pyzmq xxhash tensorboardX onnx onnxruntime aiohttp prometheus_client pyarrow fusepy
