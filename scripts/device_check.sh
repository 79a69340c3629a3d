#!/usr/bin/env bash
# Every CUDA check of the project in one prepared run, for a session lent a GPU machine:
#   run(command="bash scripts/device_check.sh", timeout_s=600)
# It uses the machine's own python3 (with CUDA PyTorch) and the sources in src/ (nothing to install),
# and writes the logs under $OUT (or /tmp/device_check without it). About 3-6 minutes on one H200.
set -uo pipefail
out="${OUT:-/tmp/device_check}"
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 - <<'PY' 2>&1 | tee "$out/machine.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    print(i, torch.cuda.get_device_name(i))
PY
# GPU checks of #4 (prefetch), #7 (device memory, NVML, allocator snapshot, real OOM), #8 (fp16; FSDP
# fp16 needs 2 GPUs), then the placement tests again with CUDA present.
timeout 300 python3 -m pytest -q -rs --timeout 240 tests/devices/test_gpu.py tests/data_loader/test_data_placement.py \
  2>&1 | tee "$out/gpu_tests.log"
status=${PIPESTATUS[0]}
# The monitor's overhead with CUDA counters and NVML sensors being read (issue #7's figure).
timeout 60 python3 benchmarks/bench_monitor.py --steps 200 --rounds 3 --device cuda 2>&1 | tee "$out/bench_monitor.log"
# Training-step overhead on the GPU against a hand-written loop (issue #2's figure, CUDA side).
timeout 150 python3 benchmarks/bench_training_step.py --widths 1024 64 --reps 11 2>&1 | tee "$out/bench_step.log"
exit "$status"
