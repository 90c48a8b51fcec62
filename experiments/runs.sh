#!/usr/bin/env bash
# The training experiment's runs, in resumable pieces that fit one device call (< 10 minutes).
#
#   experiments/runs.sh [PROFILE] [RUN ...]       # from the repository root
#
# PROFILE: smoke (default), small, small-sumq, paper or paper-sumq. RUNs: default all seventeen, in the order below.
# Environment:
#   BUDGET   seconds this call may take in all (default 540: a 600 s call keeps a minute spare)
#   GPUS     the GPU indices to use, e.g. "0" or "0 1" (default: all that nvidia-smi lists)
#   PER_GPU  runs at a time on each GPU (default 1: two at a time on a 2-GPU machine); each of
#            the workers takes the next unclaimed run, worker w on the (w mod #GPUS)-th GPU.
#            Emulated runs of the small profile grow to 66-73 GB each on an H200
#            (experiments/README.md), so two on one GPU can run out of memory; a failed run
#            resumes from its last checkpoint in the next call: PER_GPU=1 for emulated runs
#            that must finish in one
#   DATA     the corpus (default data/english-text.txt.xz, else data/english-text.txt)
#   EXTRA    more flags for every run, e.g. "--steps 300 --eval-interval 50"
#   PYTHON   the interpreter (default python3)
#   OUT      when set, results and logs are packed into $OUT/results.tgz
#
# Each call advances every unfinished run by one piece (--resume --time-limit) and skips the
# runs whose JSON says done; call it again, with the same PROFILE and EXTRA, to continue.
# Results go to experiments/results/PROFILE/ (<run>.json, results.md, curves), logs to
# experiments/logs/PROFILE/. Checkpoints stay in experiments/checkpoints/PROFILE/
# (git-ignored): they survive between calls only while the device machine stays warm
# (about 30 s after a call), so chain the calls.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=${1:-smoke}
shift || true
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(bf16 mxfp8 nvfp4 fp4 leak per_tensor mm_prepr mm_diag mm_exp mxfp8_bf16s nvfp4_bf16s mxfp8_sumc
                                 mxfp8_bf16s_sumc nvfp4_sumc mm_prepr_sumc mm_diag_sumc mm_exp_sumc)
budget=${BUDGET:-540}
read -r -a gpus <<< "${GPUS:-$(seq -s ' ' 0 $(( $( (nvidia-smi -L 2>/dev/null || true) | wc -l) - 1 )))}"
[ ${#gpus[@]} -gt 0 ] || gpus=(0)
per_gpu=${PER_GPU:-1}
python=${PYTHON:-python3}
data=${DATA:-data/english-text.txt.xz}
[ -f "$data" ] || data=data/english-text.txt
deadline=$(( $(date +%s) + budget ))
# One folder per profile, so a smoke run and a paper run of the same name never meet.
results=experiments/results/$profile
ckpts=experiments/checkpoints/$profile
logs=experiments/logs/$profile
claims=$(mktemp -d)
trap 'rm -rf "$claims"' EXIT
mkdir -p "$results" "$logs"

is_done() { grep -qs '"done": true' "$results/$1.json"; }

# A worker takes the next run nobody has claimed (mkdir is atomic), so a worker whose runs
# finish early picks up more; it stops when the budget is spent.
worker() {
  local gpu=$1 i run left
  for i in "${!runs[@]}"; do
    run=${runs[$i]}
    is_done "$run" && continue
    mkdir "$claims/$run" 2>/dev/null || continue
    # 20 s for Python, torch and CUDA to start before flamia.train's clock does.
    left=$(( deadline - $(date +%s) - 20 ))
    (( left > 30 )) || return 0
    echo "$(date +%T) $run on GPU $gpu, ${left}s"
    # shellcheck disable=SC2086  # EXTRA is a list of flags
    CUDA_VISIBLE_DEVICES=$gpu PYTHONUNBUFFERED=1 "$python" -m flamia.train --run "$run" \
      --profile "$profile" --data "$data" --results-dir "$results" --ckpt-dir "$ckpts" \
      --resume --time-limit "$left" ${EXTRA:-} \
      >>"$logs/$run.log" 2>&1 || echo "$(date +%T) $run failed: see $logs/$run.log"
  done
}

for ((w = 0; w < ${#gpus[@]} * per_gpu; w++)); do
  worker "${gpus[w % ${#gpus[@]}]}" &
done
wait

if "$python" -m flamia.train --report --results-dir "$results" >/dev/null; then
  cat "$results/results.md"
fi
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/results.tgz" "$results" "$logs"
fi
