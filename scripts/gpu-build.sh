#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs, for a GPU machine that has no Rust toolchain:
# `wick`, the GPU tests (tests/gpu.rs), and the memory_report and nccl_bandwidth examples,
# all with `--features cuda,nccl`, stripped, into target-gpu/ (about 40 MB each).
#
#     scripts/gpu-build.sh            # release (what a GPU machine should run)
#     WICK_GPU_PROFILE=dev scripts/gpu-build.sh   # the dry run's build
#
# The CUDA build environment comes from scripts/cuda-env.sh; the build goes to
# $WICK_CUDA_TARGET (default ~/.cache/wick-ci/target-cuda), outside the clone, so that
# later builds are fast and the clone's target/ keeps its CPU binaries. CI points it at the
# clone's target/, whose dev-profile dependencies its tests built.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/cuda-env.sh)"
target=${WICK_CUDA_TARGET:-$HOME/.cache/wick-ci/target-cuda}
profile=${WICK_GPU_PROFILE:-release}
build=(--profile "$profile" --features cuda,nccl --target-dir "$target")
cargo build "${build[@]}" --bin wick --example memory_report --example nccl_bandwidth
# The test binary's name carries a hash: ask cargo for it.
tests=$(cargo test "${build[@]}" --test gpu --no-run --message-format=json \
  | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "gpu" and m.get("executable"):
        print(m["executable"])')
dir=$target/$([ "$profile" = dev ] && echo debug || echo "$profile")
mkdir -p target-gpu
cp "$dir/wick" "$dir/examples/memory_report" "$dir/examples/nccl_bandwidth" target-gpu/
cp "$tests" target-gpu/gpu-tests
strip target-gpu/*
ls -l target-gpu
