#!/usr/bin/env bash
# On a GPU host (issue 7, DESIGN.md §11): the real frontend (client/python/examples/
# minilm_frontend.py, all-MiniLM-L6-v2 with every layer's attention served) against the bundled
# attention-server, once per GPU backend and dtype. Weights: a float16 copy made here with
# scripts/minilm_fp16.py (the float32 file is over the device carry limit), in $MODEL_DIR
# (default .carry/minilm-fp16). Each run checks every sentence embedding against the same model
# with local float64 attention (cosine >= 0.999) and the expected similarity order.
# Env: BACKENDS (default "fused cudnn naive auto"), DTYPES (default "float16 bfloat16"),
#      PYTHON (default python3; needs numpy, grpcio, protobuf, safetensors, tokenizers).
# Writes ${OUT:-out}/minilm-<backend>-<dtype>.txt and the server log. Exit 0 only when all pass.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
b="$root/.bundle/attn/run.sh"
model=${MODEL_DIR:-$root/.carry/minilm-fp16}
py=${PYTHON:-python3}
dir=$(mktemp -d)
"$b" attention-server --listen 127.0.0.1:0 --port-file "$dir/port" --log-level warn \
  2>"$out/minilm-server.log" &
pid=$!
for _ in $(seq 1 600); do [ -s "$dir/port" ] && break; sleep 0.1; done
if [ ! -s "$dir/port" ]; then echo "server did not start"; tail -n 20 "$out/minilm-server.log"; exit 1; fi
fail=0
for backend in ${BACKENDS:-fused cudnn naive auto}; do
  for dtype in ${DTYPES:-float16 bfloat16}; do
    f="$out/minilm-$backend-$dtype.txt"
    "$py" "$root/client/python/examples/minilm_frontend.py" --target "127.0.0.1:$(cat "$dir/port")" \
      --backend "$backend" --dtype "$dtype" --model-dir "$model" >"$f" 2>&1
    rc=$?
    echo "minilm $backend $dtype: exit $rc; $(grep -E 'Attend calls' "$f" | head -1)"
    grep -E "cosine|PASS|FAIL|Error" "$f" | sed 's/^/    /' | head -12
    [ $rc -eq 0 ] || fail=1
  done
done
kill -TERM "$pid"; wait "$pid"
echo "minilm: server exit $?"
exit $fail
