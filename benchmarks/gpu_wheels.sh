#!/usr/bin/env bash
# The wheels a lent GPU machine lacks, fetched here into .whl/ (ignored by git) so that
# they travel with the working tree (the device tool's `carry: [".whl"]`); there, with no
# network, benchmarks/gpu.sh installs them and zmqrl itself into /tmp/site.
#
# The device's image has Python 3.12 with torch, numpy, msgpack, click, pyyaml, rich,
# opencv and attrs (/work/.library/device/KINDS.md); what zmqrl needs besides is below,
# at the versions this checkout's venv runs (the CI's), each with --no-deps: every
# dependency is named here. open_spiel (and its ml-collections): the AlphaZero CUDA tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(pyzmq==27.3.0 gymnasium==1.4.0 farama-notifications==0.0.6 ale-py==0.12.1
          jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0
          rpds-py==2026.9.1 open_spiel==2.0.2 ml-collections==1.1.0)
rm -rf .whl && mkdir .whl
for pkg in "${PACKAGES[@]}"; do
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl "$pkg"
done
du -sh .whl
