#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one script for a short lease of a GPU machine (run from the repository root):
#   1. the whole-step CUDA graph tests (tests/test_step_graphs.py; skipped on machines without CUDA);
#   2. benchmarks/accel_update_step.py on CUDA (writes the README's accel_cuda section and its results JSON);
#   3. training runs on CUDA with --accelerate auto (native envs on the GPU): every algorithm to its preset's target,
#      then SAC and DQN throughput at a fixed number of steps against --accelerate off;
#   4. rlspeed profile of PPO CartPole on the GPU, and with SB3=1 Stable-Baselines3's SAC on the GPU beside rlspeed's;
#   5. the whole test suite on the GPU machine (device "auto" is CUDA there).
# Logs and results go to $OUT (default /tmp/rlspeed-cuda-check). Gymnasium wheels in .whl/ are installed first when
# present (machines without network access). Each part has its own time limit; a failing part does not stop the rest,
# and the script's exit status is the number of parts that failed. The limits add up to 630 s, over one 600 s command
# of the device tool: on a lease run QUICK=1 first (480 s), then ONLY=suite (and SB3=1 ONLY=sb3) in later calls.
set -u
OUT=${OUT:-/tmp/rlspeed-cuda-check}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu tries the script itself on a machine without a GPU
QUICK=${QUICK:-0}  # QUICK=1: of the runs to a target only TD3's, and no whole suite (a lease's last minutes)
# ONLY=NAME runs just one part (graph_tests, bench, train, profile, sb3, suite)
mkdir -p "$OUT"
rm -f "$OUT"/*.log "$OUT"/*.json "$OUT"/README.md  # nothing stale from an earlier run in the same folder
FAILED=0
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, gymnasium, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'gymnasium', gymnasium.__version__, 'numpy', numpy.__version__, torch.cuda.get_device_name(0))"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

part() {  # part NAME SECONDS COMMAND...: run with a time limit, log to $OUT/NAME.log, report the exit status
  local name=$1 limit=$2; shift 2
  [ -n "${ONLY:-}" ] && [ "$ONLY" != "$name" ] && return 0  # ONLY=NAME: just that part
  local started=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - started)) s"
  tail -n 4 "$OUT/$name.log"
  [ "$rc" = 0 ] || FAILED=$((FAILED + 1))
  return "$rc"
}

part graph_tests 100 python3 -m pytest -p no:cacheprovider -rfEs tests/test_step_graphs.py
write=""; [ "$DEVICE" = cuda ] || write="--no-write"  # a try on the CPU must not replace the CPU section
# the results it wrote are copied out only when it ran and succeeded (else they are the committed ones)
part bench 120 python3 benchmarks/accel_update_step.py --device "$DEVICE" --skip-tiny $write \
  && [ "$DEVICE" = cuda ] && [ "${ONLY:-bench}" = bench ] \
  && cp benchmarks/results/accel_update_step_cuda.json benchmarks/README.md "$OUT/"
train() {  # train LABEL ALGO ENV [ARGS...]: a run on $DEVICE with --accelerate auto, then its summary
  local dir="/tmp/rlspeed-runs/$1"
  rm -rf "$dir"
  python3 -m rlspeed train "$2" "$3" --device "$DEVICE" --accelerate auto --no-progress --out "$dir" "${@:4}" \
    >"$dir.log" 2>&1 || { tail -n 20 "$dir.log"; return 1; }
  python3 - "$dir" "$1" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
keep = ("algo", "env_id", "device", "env_backend", "total_timesteps", "train_wall_s", "sps", "steps_to_target",
        "time_to_target_s", "final_eval", "accelerate")
print(json.dumps({"label": sys.argv[2], **{k: s[k] for k in keep if k in s}}, default=str))
EOF
}
export -f train
export DEVICE
# learning with every algorithm (presets stop at their target), then throughput of SAC and DQN at a fixed number
# of steps: --accelerate auto (on CUDA: autograd through accelerate_step, whole-step graphs) against --accelerate off
# (the hand-derived updates, fp32)
# (every run goes on after a failed one; the part fails if any did)
learning="train ppo ppo CartPole-v1 || failed=1; train a2c a2c CartPole-v1 || failed=1; train dqn dqn CartPole-v1 || failed=1; \
train sac sac Pendulum-v1 || failed=1; train ddpg ddpg Pendulum-v1 || failed=1;"
[ "$QUICK" = 1 ] && learning=""
part train 200 bash -c "failed=0; mkdir -p /tmp/rlspeed-runs; $learning train td3 td3 Pendulum-v1 || failed=1; \
train sac-3k-auto sac Pendulum-v1 --target-return none --total-timesteps 3000 || failed=1; \
train sac-3k-off sac Pendulum-v1 --target-return none --total-timesteps 3000 --accelerate off || failed=1; \
train dqn-30k-auto dqn CartPole-v1 --target-return none --total-timesteps 30000 || failed=1; \
train dqn-30k-off dqn CartPole-v1 --target-return none --total-timesteps 30000 --accelerate off || failed=1; \
exit \$failed"
# rlspeed profile on the GPU (its device busy time, sync count and small-network advice were written without one)
part profile 60 python3 -m rlspeed profile ppo CartPole-v1 --device "$DEVICE"
# SB3=1: Stable-Baselines3 on the same GPU, side by side with rlspeed (SAC, RL-Zoo settings; its wheel and
# cloudpickle's must be in .whl/, see benchmarks/README.md); not written to the README (few seeds and steps).
# Run it in a call of its own (SB3=1 ONLY=sb3).
if [ "${SB3:-0}" = 1 ] && [ "${ONLY:-sb3}" = sb3 ]; then
  part sb3 240 python3 benchmarks/offpolicy.py --cases sac --device "$DEVICE" --sb3-device "$DEVICE" \
    --accelerate auto --seeds 2 --steps 2000 --budget 6000 --no-write
  grep -E "^\| (rlspeed|Stable-Baselines3)" "$OUT/sb3.log"
fi
# -n and --timeout: pytest-xdist and pytest-timeout, which the GPU machine's image has (not in the test extras)
[ "$QUICK" = 1 ] || part suite 150 python3 -m pytest -p no:cacheprovider -q -n 8 --timeout 100 -rfE tests
echo "== summary"
grep -h -E "passed|failed|error" "$OUT/graph_tests.log" "$OUT/suite.log" 2>/dev/null | tail -n 4
grep -E "SAC (plain|step-fp32|accelerated|no-graphs)" "$OUT/bench.log" 2>/dev/null
grep -E '^\{' "$OUT/train.log" 2>/dev/null
echo "== $FAILED part(s) failed"
exit "$FAILED"
