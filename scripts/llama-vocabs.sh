#!/usr/bin/env bash
# Fills DIR (default ~/.cache/wick-ci/llama-vocabs) with llama.cpp's vocabulary files and
# their test cases (models/ggml-vocab-*.gguf, .gguf.inp, .gguf.out), taken from the source
# archive of the llama-cpp-python package on PyPI, pinned by version and SHA-256. Prints
# DIR. tests/gguf_vocab.rs reads them (WICK_LLAMA_VOCABS=DIR); they are not checked in, as
# each vocabulary is several MB.
set -euo pipefail
dir=${1:-$HOME/.cache/wick-ci/llama-vocabs}
version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
if [ ! -f "$dir/.complete-$version" ]; then
  mkdir -p "$dir"
  archive="$dir/llama_cpp_python-$version.tar.gz"
  if ! echo "$sha256  $archive" | sha256sum --check --status 2> /dev/null; then
    # The archive's address, from PyPI's JSON API (resolved against it: it may be relative).
    url=$(python3 - "$version" << 'PY'
import json, sys, urllib.parse, urllib.request
api = "https://pypi.org/pypi/llama-cpp-python/json"
files = json.load(urllib.request.urlopen(api, timeout=60))["releases"][sys.argv[1]]
print(urllib.parse.urljoin(api, next(f["url"] for f in files if f["packagetype"] == "sdist")))
PY
)
    curl -fsSL --retry 3 -o "$archive" "$url"
    echo "$sha256  $archive" | sha256sum --check --status \
      || { echo "llama-vocabs: $url is not the archive pinned by SHA-256" >&2; exit 1; }
  fi
  tar -xzf "$archive" -C "$dir" --strip-components=4 --wildcards \
    "llama_cpp_python-$version/vendor/llama.cpp/models/ggml-vocab-*"
  rm "$archive"
  touch "$dir/.complete-$version"
fi
echo "$dir"
