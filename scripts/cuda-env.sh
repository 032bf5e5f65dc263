#!/usr/bin/env bash
# Prints the export lines of a CUDA 13.0 build environment for `--features cuda,nccl`, made
# on a machine with no GPU and no CUDA toolkit, from NVIDIA's wheels on PyPI:
#
#     eval "$(scripts/cuda-env.sh)"
#     cargo build --release --features cuda,nccl
#
# The first call installs into $WICK_CUDA_HOME (default ~/.cache/wick-cuda), later calls only
# print. What it makes:
#  - a venv with nvcc, nvvm, cccl, the crt headers, cudart, cublas, curand, nvrtc and NCCL,
#    all CUDA 13.0: the 580 drivers of the GPU machines this was made for run 13.0 PTX, and
#    a newer nvvm emits PTX their ptxas rejects;
#  - a link-time stub libcuda.so (soname libcuda.so.1) exporting the driver functions cudarc
#    declares, as the toolkit's lib64/stubs does. The real driver replaces it at run time;
#    a binary run here fails at its first CUDA call;
#  - unversioned .so links for the linker.
# Run time on a GPU machine needs libcudart.so.13, libcublas.so.13, libcurand.so.10 and
# libnccl.so.2 on LD_LIBRARY_PATH (scripts/gpu-check.sh finds them in the machine's Python).
set -euo pipefail
cd "$(dirname "$0")/.."
home="${WICK_CUDA_HOME:-$HOME/.cache/wick-cuda}"
venv="$home/venv"
nvidia() { echo "$venv"/lib/python3*/site-packages/nvidia; }

if [ ! -e "$home/.ready" ]; then
  {
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "nvidia-cuda-nvcc==13.0.88" "nvidia-nvvm==13.0.*" \
      "nvidia-cuda-cccl==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-cuda-runtime==13.0.*" \
      "nvidia-cublas==13.0.*" "nvidia-curand==10.4.*" "nvidia-cuda-nvrtc==13.0.*" \
      "nvidia-nccl-cu13"
    # The stub's symbols come from the cudarc this workspace locks.
    cargo fetch --quiet
    version=$(grep -A1 '^name = "cudarc"' Cargo.lock | sed -n 's/^version = "\(.*\)"/\1/p')
    sys=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-"$version"/src/driver/sys/mod.rs | head -n1)
    mkdir -p "$home/lib"
    grep -oE "pub (unsafe )?fn cu[A-Za-z0-9_]+" "$sys" | awk '{print $NF}' | sort -u \
      | awk '{print "void " $1 "(void) {}"}' > "$home/lib/cuda_stub.c"
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$home/lib/libcuda.so" "$home/lib/cuda_stub.c"
    for lib in "$(nvidia)"/cu13/lib/lib*.so.* "$(nvidia)"/nccl/lib/libnccl.so.*; do
      name=$(basename "$lib")
      ln -sf "$lib" "$home/lib/${name%%.so*}.so"
    done
    touch "$home/.ready"
  } >&2
fi

cu13="$(nvidia)/cu13"
echo "export PATH=\"$cu13/bin:\$PATH\""
echo "export CUDA_ROOT=\"$cu13\" CUDA_PATH=\"$cu13\" CUDA_COMPUTE_CAP=\${CUDA_COMPUTE_CAP:-90}"
echo "export NCCL_HOME=\"$(nvidia)/nccl\""
# candle-kernels builds its MoE and quantized-product kernels (six minutes of nvcc on two
# cores) on half the cores unless told otherwise.
echo "export CUDAFORGE_THREADS=\${CUDAFORGE_THREADS:-$(nproc)}"
# The linker finds the stub and NCCL through LIBRARY_PATH rather than RUSTFLAGS: RUSTFLAGS
# is part of every crate's hash, so setting it would rebuild the crates CUDA does not touch.
echo "export LIBRARY_PATH=\"$home/lib:$(nvidia)/nccl/lib\${LIBRARY_PATH:+:\$LIBRARY_PATH}\""
