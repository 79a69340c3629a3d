#!/usr/bin/env bash
# trl's and diffusers' own test suites (issue 40 item 7), run twice: once against the real reference package
# (accelerate 1.15.0, the baseline) and once with accelerando standing in for it through
# `accelerando.install_as_accelerate()` (a sitecustomize.py on PYTHONPATH). compare.py then counts, per suite,
# how many tests that pass on the reference pass here, and lists the rest with their first message line.
#
#   scripts/client_suites/run.sh                    # both suites: baseline + candidate + comparison
#   scripts/client_suites/run.sh candidate trl      # one side, one suite
#   scripts/client_suites/run.sh compare            # comparison only
#
# Environment (a separate venv, never the project's: the test releases pin other library versions):
#   python -m venv V && V/bin/pip install torch==2.13.0 && V/bin/pip install -e . accelerate==1.15.0 trl==1.9.0 \
#     diffusers==0.40.0 transformers peft datasets pytest pytest-timeout parameterized psutil pytest-datadir \
#     pillow rich requests-mock            # resolves to transformers 5.24.0, peft 0.21.2, datasets 5.2.0
# then run this script with V/bin on PATH.
# Env: CLIENT_SUITES_DIR (checkouts, stand-ins, results; default ./.client_suites), TRL_GIT / DIFFUSERS_GIT
# (where to clone the tests from; default the GitHub repositories), CLIENT_SUITES_FILE_TIMEOUT (per file, 2400 s; SIGINT, so the finished tests still reach the XML),
# CLIENT_SUITES_TEST_TIMEOUT (per test, 300 s). Offline: HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1; the Hub
# repositories the tests load are built locally by build_standins.py from trl's own generation scripts.
set -u -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODE=${1:-both}; [ $# -gt 0 ] && shift
SUITES=("${@:-trl diffusers}"); SUITES=(${SUITES[*]})
case "$MODE" in baseline|candidate|both|compare) ;; *) sed -n '2,20p' "$0"; exit 2;; esac
PY=$(command -v python)
DIR=${CLIENT_SUITES_DIR:-$PWD/.client_suites}; mkdir -p "$DIR"; DIR=$(cd "$DIR" && pwd)
TRL_TAG=v1.9.0 DIFFUSERS_TAG=v0.40.0
TRL_FILES=(test_sft_trainer.py test_reward_trainer.py test_dpo_trainer.py test_callbacks.py test_utils.py
  test_data_utils.py)
DIFFUSERS_FILES=(models/unets/test_models_unet_2d.py models/unets/test_models_unet_1d.py
  models/unets/test_models_unet_2d_condition.py models/autoencoders/test_models_autoencoder_kl.py
  models/autoencoders/test_models_autoencoder_tiny.py models/autoencoders/test_models_vq.py
  models/test_layers_utils.py models/test_attention_processor.py)
# Some files only (space-separated, relative to tests/): CLIENT_SUITES_TRL_FILES, CLIENT_SUITES_DIFFUSERS_FILES.
[ -n "${CLIENT_SUITES_TRL_FILES:-}" ] && read -r -a TRL_FILES <<<"$CLIENT_SUITES_TRL_FILES"
[ -n "${CLIENT_SUITES_DIFFUSERS_FILES:-}" ] && read -r -a DIFFUSERS_FILES <<<"$CLIENT_SUITES_DIFFUSERS_FILES"

checkout() {  # $1 = name, $2 = git source, $3 = tag, $4.. = paths to extract
  local name=$1 src=$2 tag=$3; shift 3
  [ -d "$DIR/$name/tests" ] && return 0
  local tmp; tmp=$(mktemp -d)
  git clone -q --bare --depth 1 --branch "$tag" "$src" "$tmp/repo" || { echo "clone $src@$tag failed" >&2; exit 2; }
  mkdir -p "$DIR/$name" && git --git-dir "$tmp/repo" archive "$tag" "$@" | tar -x -C "$DIR/$name"
  rm -rf "$tmp"
}
checkout trl "${TRL_GIT:-https://github.com/huggingface/trl}" "$TRL_TAG" tests scripts pyproject.toml
checkout diffusers "${DIFFUSERS_GIT:-https://github.com/huggingface/diffusers}" "$DIFFUSERS_TAG" tests

# A quiet, offline, isolated environment for both runs.
for v in $(env | sed -n 's/^\(ACCELERATE_[A-Za-z0-9_]*\)=.*/\1/p; s/^\(ACCELERANDO_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 WANDB_MODE=disabled
export TOKENIZERS_PARALLELISM=false PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
export HF_HOME="$DIR/standins/hf" CLIENT_SUITES_DATASETS="$DIR/standins/datasets"
[ -d "$DIR/standins/hf/hub" ] || "$PY" "$HERE/build_standins.py" "$DIR/trl" "$DIR/standins" >"$DIR/standins.log" 2>&1 \
  || { echo "building the stand-ins failed: $DIR/standins.log" >&2; exit 2; }

run_suite() {  # $1 = baseline|candidate, $2 = trl|diffusers
  local kind=$1 suite=$2 out="$DIR/results/$1/$2" f xml log rc pp="$HERE"
  local -a files marks=()
  mkdir -p "$out/junit" "$out/logs" "$out/tmp"
  if [ "$kind" = candidate ]; then
    mkdir -p "$DIR/standin"
    printf 'import accelerando\naccelerando.install_as_accelerate()\n' > "$DIR/standin/sitecustomize.py"
    pp="$DIR/standin:$pp"
  fi
  if [ "$suite" = trl ]; then files=("${TRL_FILES[@]}"); marks=(-m "not slow and not low_priority")
  else files=("${DIFFUSERS_FILES[@]}"); fi
  PYTHONPATH="$pp" "$PY" -c "import accelerate; print('$kind $suite: import accelerate ->', accelerate.__file__)"
  for f in "${files[@]}"; do
    xml="$out/junit/${f//\//_}.xml"; log="$out/logs/${f//\//_}.log"; rm -f "$xml"
    (cd "$DIR/$suite" && PYTHONPATH="$pp" TMPDIR="$out/tmp" nice -n 10 timeout -s INT -k 60 "${CLIENT_SUITES_FILE_TIMEOUT:-2400}" \
      "$PY" -m pytest -p suite_shims -p no:cacheprovider -q -rfE "${marks[@]}" \
      --timeout "${CLIENT_SUITES_TEST_TIMEOUT:-300}" --junitxml="$xml" -o junit_family=xunit1 "tests/$f" \
      >"$log" 2>&1 </dev/null); rc=$?
    echo "  $kind $suite $f: $(tail -1 "$log" | cut -c1-110) (rc=$rc)"
  done
}

for suite in "${SUITES[@]}"; do
  [ "$MODE" = baseline ] || [ "$MODE" = both ] && run_suite baseline "$suite"
  [ "$MODE" = candidate ] || [ "$MODE" = both ] && run_suite candidate "$suite"
done
for suite in "${SUITES[@]}"; do
  "$PY" "$HERE/compare.py" "$suite" "$DIR/results/baseline/$suite/junit" "$DIR/results/candidate/$suite/junit" \
    | tee "$DIR/results/$suite.txt"
done
