#!/bin/bash
# Fine-tunes the DFlash drafter on a CUDA machine for MINUTES minutes, from parts that
# scripts/split_for_transfer.sh made of the target GGUF and the start drafter (the folders PARTS.*, sent
# there one call at a time and gathered in $STAGE). Writes the drafter to $OUT: its weights in 15 MB pieces
# (w.0, w.1, ...: `cat w.* > model.safetensors`), the rest of its folder as meta.tar, the log gzipped.
#
#   PARTS=.parts MINUTES=6 OUT=/tmp/result scripts/train_dflash_on_gpu.sh [extra `specdec train dflash` options]
#
# Each call before the last only gathers its part: `STAGE_ONLY=1 PARTS=.parts scripts/train_dflash_on_gpu.sh`.
# Wheels the machine lacks (gguf) go in $WHEELS. The recipe: every response position an anchor (up to
# 512, DFlash's reference), 8192 tokens a step, gradient norm clipped at 1.0, the learning rate's cosine run
# over the time budget (--max-minutes).
set -uo pipefail
PARTS=${PARTS:-.parts}; STAGE=${STAGE:-/tmp/parts}; MINUTES=${MINUTES:-6}; OUT=${OUT:?set OUT}
WHEELS=${WHEELS:-.wheels}; DEVICE=${DEVICE:-cuda}
mkdir -p "$STAGE" && cp "$PARTS".*/blob.* "$STAGE"/ 2>/dev/null
ls -la "$STAGE"
[ -n "${STAGE_ONLY:-}" ] && exit 0
cat "$STAGE"/blob.part.* > /tmp/blob.tar || exit 3
echo "$(cat "$STAGE"/blob.sha256)  /tmp/blob.tar" | sha256sum -c - || exit 4
rm -rf /tmp/start /tmp/out && mkdir -p /tmp/start && tar xf /tmp/blob.tar -C /tmp/start && rm /tmp/blob.tar
gguf=$(ls /tmp/start/*.gguf | head -1); drafter=$(find /tmp/start -mindepth 1 -maxdepth 1 -type d | head -1)
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl || exit 5
fi
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 SPECDEC_CACHE=/tmp/specdec-cache
D=datasets/gemma-3-270m-distill
python3 -c "import sys; from specdec.cli import main; sys.exit(main(sys.argv[1:]))" train dflash \
  --target "$gguf" --device "$DEVICE" --data $D-long,$D-128-s19,$D-128,$D-128-s18 --output /tmp/out \
  --init-from "$drafter" --max-minutes "$MINUTES" --max-steps 100000 --tokens-per-step 8192 --lr 3e-4 \
  --warmup-steps 10 --grad-clip 1.0 --num-anchors 512 --max-seq-len 4608 --checkpoint-every 20 "$@" \
  2>&1 | tr '\r' '\n' | tee /tmp/train.log | awk '!/^train:/ || (++n % 40 == 0)'
rc=$?
mkdir -p "$OUT"
split -b 15000000 -d -a 1 /tmp/out/model.safetensors "$OUT/w."
tar cf "$OUT/meta.tar" -C /tmp/out --exclude model.safetensors --exclude training_state.pt .
gzip -c /tmp/train.log > "$OUT/train.log.gz"
exit $rc
