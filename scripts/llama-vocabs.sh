#!/usr/bin/env bash
# Fills DIR (default ~/.cache/wick/llama-vocabs) with llama.cpp's vocabulary files and
# their test cases (models/ggml-vocab-*.gguf, .gguf.inp, .gguf.out), taken from the source
# archive of the llama-cpp-python package on PyPI, pinned by version and SHA-256. Prints
# DIR. tests/gguf_vocab.rs reads them (WICK_LLAMA_VOCABS=DIR); they are not checked in, as
# each vocabulary is several MB.
set -euo pipefail
dir=${1:-$HOME/.cache/wick/llama-vocabs}
version=0.3.36
if [ ! -f "$dir/.complete-$version" ]; then
  archive=$(bash "$(dirname "$0")/pypi-file.sh" llama-cpp-python "$version" \
    "llama_cpp_python-$version.tar.gz" \
    832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e "$dir")
  tar -xzf "$archive" -C "$dir" --strip-components=4 --wildcards \
    "llama_cpp_python-$version/vendor/llama.cpp/models/ggml-vocab-*"
  rm "$archive"
  touch "$dir/.complete-$version"
fi
echo "$dir"
