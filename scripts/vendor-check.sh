#!/usr/bin/env bash
# vendor/candle-core is candle-core 0.11.1 as crates.io ships it, with the patches that
# vendor/series names applied in its order (`patch -p1` inside the release). This rebuilds
# it that way from the registry's own .crate file and fails on any difference, so that the
# patches beside the copy are exactly what it holds.
#
# usage: scripts/vendor-check.sh      (from anywhere; needs cargo and crates.io)
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.11.1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/fetch/src"
cat > "$work/fetch/Cargo.toml" <<TOML
[package]
name = "vendor-check"
version = "0.0.0"
edition = "2021"

[dependencies]
candle-core = "=$version"
TOML
echo 'fn main() {}' > "$work/fetch/src/main.rs"
cargo fetch --quiet --manifest-path "$work/fetch/Cargo.toml"
crate=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/candle-core-$version.crate | head -1)
tar -xzf "$crate" -C "$work"
release=$work/candle-core-$version
while read -r name; do
  [ -n "$name" ] || continue
  patch -p1 --quiet --no-backup-if-mismatch -d "$release" < "vendor/$name" \
    || { echo "vendor-check: vendor/$name does not apply in order" >&2; exit 1; }
done < vendor/series
if ! diff -r "$release" vendor/candle-core > "$work/diff"; then
  echo "vendor-check: vendor/candle-core differs from candle-core $version plus vendor/series:" >&2
  head -50 "$work/diff" >&2
  exit 1
fi
echo "vendor-check: vendor/candle-core is candle-core $version plus $(grep -c . vendor/series) patches"
