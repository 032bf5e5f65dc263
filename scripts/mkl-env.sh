#!/usr/bin/env bash
# Prints the export line of an Intel MKL build environment for `--features mkl`, from
# Intel's wheels on PyPI (no oneAPI installer, no Debian non-free):
#
#     eval "$(scripts/mkl-env.sh)"
#     cargo build --release --features mkl
#
# The first call installs into $WICK_MKL_HOME (default ~/.cache/wick-mkl), later calls only
# print. Candle's `mkl` feature (vendor/candle-core) links MKL statically and sequential
# (intel-mkl-src's `mkl-static-lp64-seq`: no OpenMP, each product shared out over the
# rank's rayon pool): its build script looks under $MKLROOT for `mkl.h` (mkl-include) and
# `libmkl_core.a`, `libmkl_sequential.a` and the other static libraries (mkl-static), so
# the binary needs nothing at run time. The default build never links MKL.
set -euo pipefail
home="${WICK_MKL_HOME:-$HOME/.cache/wick-mkl}"

if [ ! -e "$home/.ready" ]; then
  {
    mkdir -p "$home"
    wheels=$(mktemp -d)
    python3 -m pip download --quiet --no-deps -d "$wheels" \
      "mkl-static==2026.2.*" "mkl-include==2026.2.*"
    for wheel in "$wheels"/*.whl; do
      python3 -m zipfile -e "$wheel" "$wheels/unpacked"
    done
    # Only what the static link reads: one copy of each library, so that intel-mkl-src
    # finds exactly one MKL (it refuses two).
    mkdir -p "$home/lib" "$home/include"
    cp "$wheels"/unpacked/mkl_static-*.data/data/lib/libmkl_*.a "$home/lib/"
    cp -r "$wheels"/unpacked/mkl_include-*.data/data/include/. "$home/include/"
    rm -rf "$wheels"
    touch "$home/.ready"
  } >&2
fi
echo "export MKLROOT=$home"
