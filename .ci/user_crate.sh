#!/usr/bin/env bash
# typed-amp used as a user would: a new crate outside the workspace (`cargo new` in a temporary
# directory) that depends on this checkout the way README.md's "Using typed-amp in your project"
# says (its `toml` block after the `<!-- user dependency` marker, `/path/to/typed-amp` replaced
# by this checkout's path), with README.md's "What it looks like" program (the `rust` block
# after the `<!-- what it looks like` marker) as its src/main.rs, built and run. Either block
# breaking (a program that no longer compiles or runs, a dependency line that no longer
# resolves) fails the script.
#
# Offline-capable: the checkout's Cargo.lock is copied into the new crate, so cargo resolves
# the versions typed-amp's tests use from its cache without fetching the crates.io index (if
# they are not cached, cargo downloads them, as it would for a user).
#
# The new crate's target directory is $USER_CRATE_TARGET_DIR if set (CI may keep it between
# runs), else one inside the temporary directory, removed with it.
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$(pwd)

# The first fenced block after the line holding `$1`, without its fences.
block_after() {
    awk -v marker="$1" '
        index($0, marker) { found = 1; next }
        found && /^```/ { if (inblock) exit; inblock = 1; next }
        inblock { print }
    ' README.md
}

program=$(block_after "<!-- what it looks like")
dependency=$(block_after "<!-- user dependency")
if [ -z "$program" ] || [ -z "$dependency" ]; then
    echo "README.md lacks the program after <!-- what it looks like --> or the dependency after <!-- user dependency -->" >&2
    exit 1
fi
if ! grep -q '/path/to/typed-amp' <<<"$dependency"; then
    echo "README.md's dependency block does not name /path/to/typed-amp, the clone's path" >&2
    exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/typed-amp-user-crate.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
target_dir=${USER_CRATE_TARGET_DIR:-$tmp/target}

cargo new --quiet --bin --vcs none --name my-model "$tmp/my-model"
cd "$tmp/my-model"
# `cargo new` ends Cargo.toml with an empty `[dependencies]` table: README's block replaces it.
sed -i '/^\[dependencies\]/,$d' Cargo.toml
printf '%s\n' "${dependency//\/path\/to\/typed-amp/$checkout}" >>Cargo.toml
printf '%s\n' "$program" >src/main.rs
cp "$checkout/Cargo.lock" Cargo.lock

echo "+ $tmp/my-model/Cargo.toml:"
cat Cargo.toml
echo "+ cargo run (src/main.rs: README's \"What it looks like\", $(wc -l <src/main.rs) lines)"
CARGO_TARGET_DIR="$target_dir" cargo run --quiet
echo "a new crate depending on $checkout as README.md says built and ran README's program"
