#!/usr/bin/env bash
# Every CUDA check of the project in one prepared run, for a session lent a GPU machine:
#   run(command="bash scripts/device_check.sh", timeout_s=600)
# It uses the machine's own python3 (with CUDA PyTorch) and the sources in src/, and writes the logs
# under $OUT (or /tmp/device_check without it). About 3-7 minutes on one H200 (8 at most).
#
# FP8 packages (issue #18): the machine reaches no package registry, so optional ones travel as wheels
# in .whl/ (git-ignored; name it in run's carry). torchao (the native-FP8 check) is small: here, fetch
# the release built for the machine's torch (2.11 when last seen; torchao's README pairs them) with
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl torchao==VERSION
# Transformer Engine cannot travel (its CUDA wheels are far over the 64 MiB a call carries, and its
# PyTorch extension builds from source) and MS-AMP is not on PyPI (built from github.com/Azure/MS-AMP):
# without them their tests are skipped, each naming what it needs. megatron-core (issue #17's engine)
# is small and travels the same way (same pip download line, megatron-core==0.16.1); its tests skip
# without it.
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
if compgen -G ".whl/*.whl" >/dev/null; then
  timeout 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl 2>&1 | tee "$out/wheels.log" && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
python3 -c "import importlib.util as u; print('fp8 packages:', {n: u.find_spec(n) is not None for n in ('torchao', 'transformer_engine', 'msamp', 'megatron')})" \
  2>&1 | tee -a "$out/machine.txt"
# GPU checks of #4 (prefetch), #7 (device memory, NVML, allocator snapshot, real OOM), #8 (fp16; FSDP
# fp16 needs 2 GPUs), #18 (torchao native FP8, Transformer Engine and MS-AMP, each against the library
# by hand), #17 (the Megatron-LM engine over megatron-core against megatron-core by hand), then the placement tests again with CUDA present.
timeout 330 python3 -m pytest -q -rs --timeout 200 tests/devices/test_gpu.py tests/devices/test_gpu_megatron.py tests/data_loader/test_data_placement.py \
  2>&1 | tee "$out/gpu_tests.log"
status=${PIPESTATUS[0]}
# The monitor's overhead with CUDA counters and NVML sensors being read (issue #7's figure).
timeout 60 python3 benchmarks/bench_monitor.py --steps 200 --rounds 3 --device cuda 2>&1 | tee "$out/bench_monitor.log"
# Training-step overhead on the GPU against a hand-written loop (issue #2's figure, CUDA side).
timeout 120 python3 benchmarks/bench_training_step.py --widths 1024 64 --reps 11 2>&1 | tee "$out/bench_step.log"
exit "$status"
