#!/usr/bin/env bash
# One lease of a GPU machine (Python 3.12, torch 2.11 + Triton, no network): install the carried
# wheels, then run three jobs side by side, each under its own time limit, logs to $OUT:
#   A: the CUDA tests (tests/test_cuda.py, tests/test_nvfuser.py), then benchmarks/memory_budget.py
#      on the GPU (saved bytes and recompute vs torch.compile, attention through Thunder's sdpa executor);
#   B, C: benchmarks/device_checks.py on the GPT and LLaMA "medium" models (allocator peak per budget).
# (python3 -P keeps the checkout's own thunder_remat/, which lacks executors/, off sys.path.)
# Compiles are mostly single-threaded Python, so the jobs share the 16 cores; step times are
# therefore taken under load (read them as relative, within one job).
# Needs: .whl/ with lightning-thunder 0.2.6, igraph, texttable, looseversion, optree, dill (cp312).
# Fetch them on a machine with network access (not committed; carry .whl with the run):
#   for w in lightning_thunder==0.2.6 igraph==1.0.0 texttable looseversion optree==0.20.0 dill==0.4.1; do
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 -d .whl "$w"; done
set -u
OUT=${OUT:-/tmp/out}
LIMIT=${LIMIT:-420}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
# The package as CI installs it (thunder_remat with executors/ as thunder_remat.executors), without a build.
rm -rf /tmp/src && mkdir -p /tmp/src && cp -r thunder_remat /tmp/src/ && cp -r executors /tmp/src/thunder_remat/executors
export PYTHONPATH=/tmp/src:/tmp/site PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -P -c \
  "import torch, triton, thunder, igraph; print(torch.__version__, torch.version.cuda, triton.__version__, thunder.__version__, igraph.__version__)"; } \
  > "$OUT/env.txt" 2>&1
(
  timeout 240 python3 -P -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_nvfuser.py -rs > "$OUT/tests.txt" 2>&1
  echo "pytest exit $?" >> "$OUT/tests.txt"
  timeout $((LIMIT - 240)) python3 benchmarks/memory_budget.py --device cuda --executor torchcompile --models gpt \
    --size small --budgets 1.0,0.5,0.1 > "$OUT/memory_budget.txt" 2> "$OUT/memory_budget.log"
  echo "exit $?" >> "$OUT/memory_budget.txt"
) &
timeout "$LIMIT" python3 benchmarks/device_checks.py --device cuda --executor torchcompile --model gpt --size medium \
  --budgets 1.0,0.5,0.1,0.0 --torch-budgets 1.0,0.1 > "$OUT/checks_gpt.txt" 2>&1 &
timeout "$LIMIT" python3 benchmarks/device_checks.py --device cuda --executor torchcompile --model llama --size medium \
  --budgets 1.0,0.5,0.1,0.0 --torch-budgets 1.0 --no-measured > "$OUT/checks_llama.txt" 2>&1 &
wait
grep -v "^W[0-9]" "$OUT"/checks_*.txt | grep -v "^\s*$" | tail -40
tail -5 "$OUT/tests.txt"
tail -12 "$OUT/memory_budget.txt"
