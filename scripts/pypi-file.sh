#!/usr/bin/env bash
# Fetches FILE, a release file of the PyPI package NAME at VERSION, into DIR unless it is
# there already, checks it against SHA256, and prints its path. Its address comes from
# PyPI's JSON API (resolved against it, as a mirror may answer with a relative one).
# Usage: scripts/pypi-file.sh NAME VERSION FILE SHA256 DIR
set -euo pipefail
name=$1 version=$2 file=$3 sha256=$4 dir=$5
mkdir -p "$dir"
path=$dir/$file
if ! echo "$sha256  $path" | sha256sum --check --status 2> /dev/null; then
  url=$(python3 - "$name" "$version" "$file" << 'PY'
import json, sys, urllib.parse, urllib.request
name, version, file = sys.argv[1:]
api = f"https://pypi.org/pypi/{name}/json"
files = json.load(urllib.request.urlopen(api, timeout=60))["releases"][version]
print(urllib.parse.urljoin(api, next(f["url"] for f in files if f["filename"] == file)))
PY
)
  curl -fsSL --retry 3 -o "$path.part" "$url"
  echo "$sha256  $path.part" | sha256sum --check --status \
    || { echo "pypi-file: $url is not the file pinned by SHA-256" >&2; exit 1; }
  mv "$path.part" "$path"
fi
echo "$path"
