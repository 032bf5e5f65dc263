#!/usr/bin/env bash
# Each wick crate used alone: every example of crates/<crate>/examples is built as the main
# program of a crate that depends on that one wick crate (and candle) only, so an example
# that needs something its crate does not re-export fails here. CI runs it.
# Usage: scripts/standalone-check.sh [target dir]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
target=${1:-$HOME/.cache/wick-ci/target-standalone}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
n=0
for crate_dir in "$repo"/crates/*/; do
  crate=$(basename "$crate_dir")
  package=$(sed -n 's/^name = "\(.*\)"/\1/p' "$crate_dir/Cargo.toml" | head -1)
  for example in "$crate_dir"examples/*.rs; do
    [ -e "$example" ] || continue
    name=$(basename "$example" .rs)
    dir="$work/$crate-$name"
    mkdir -p "$dir"
    cat > "$dir/Cargo.toml" <<TOML
[package]
name = "alone-$crate-$name"
version = "0.0.0"
edition = "2021"
publish = false

[[bin]]
name = "$name"
path = "$example"

[dependencies]
$package = { path = "$crate_dir" }
candle-core = "0.11.1"
candle-nn = "0.11.1"

[patch.crates-io]
candle-core = { path = "$repo/vendor/candle-core" }

[workspace]
TOML
    # The workspace's versions, so the build reuses what the other builds compiled.
    cp "$repo/Cargo.lock" "$dir/Cargo.lock"
    echo "== $package alone: examples/$name.rs"
    cargo check --quiet --manifest-path "$dir/Cargo.toml" --target-dir "$target"
    n=$((n + 1))
  done
done
echo "standalone-check: $n examples built, each against its own crate only"
