#!/usr/bin/env bash
# One call on a lent GPU machine (one H200 or H100), within 8 minutes, for the figures
# docs/benchmarks.md lacks: pi05 at its full size in bf16, LoRA and full fine-tuning (step time,
# samples/s, MFU, peak memory against the memory plan); a local job on the GPU end to end; one
# started from that job's output (--from-checkpoint); serving latency at batch 1 with 1, 2 and 3
# cameras. Each stage runs on its own under a time limit; a failing stage is reported in one line
# and the next one runs. The summary and every stage's log go to $OUT (else bench/out/gpu_check).
#
# There (the machine reaches no package registry; carry the wheels bench/gpu_wheels.sh fetched):
#     bash bench/gpu_check.sh                      # with `carry: [".whl"]`
# Here, every stage on the CPU at pi05-tiny's sizes (what tests/bench/test_gpu_check.py runs):
#     RELAY_GPU_CHECK_DEVICE=cpu bash bench/gpu_check.sh
# RELAY_GPU_CHECK_STAGES=lora,full,train,from_checkpoint,latency picks stages (all by default).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEVICE=${RELAY_GPU_CHECK_DEVICE:-cuda}
STAGES=${RELAY_GPU_CHECK_STAGES:-lora,full,train,from_checkpoint,latency}
LOGS=${OUT:-$ROOT/bench/out/gpu_check}
WORK=$(mktemp -d /tmp/relay-gpu-check.XXXXXX)
mkdir -p "$LOGS"
SUMMARY=$LOGS/summary.txt
: >"$SUMMARY"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

say() { echo "$*" | tee -a "$SUMMARY"; }

# Relay itself from this checkout; on a machine without it installed, its missing dependencies
# from the carried wheels (never fetched there: it has no registry).
if ! python3 -c "import pydantic, transformers, peft, gymnasium, sqlalchemy" 2>/dev/null; then
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        say "setup: Relay's dependencies are missing here and no .whl folder came with the call: run" \
            "'bash bench/gpu_wheels.sh' on the CPU machine and carry .whl"
        exit 2
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/relay-site .whl/*.whl || { say "setup: the carried wheels did not install"; exit 2; }
    export PYTHONPATH=/tmp/relay-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$ROOT/sdk:$ROOT/engine:$ROOT/api:$ROOT/worker:$ROOT${PYTHONPATH:+:$PYTHONPATH}
RELAY=(python3 -m relay.cli)

if [ "$DEVICE" = cuda ]; then
    if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        say "setup: no CUDA GPU is available to PyTorch here ($(python3 -c 'import torch; print(torch.__version__)'));" \
            "RELAY_GPU_CHECK_DEVICE=cpu runs the stages on the CPU at pi05-tiny's sizes"
        exit 2
    fi
    MODEL=pi05; BATCH=32; STEPS=10; TRAIN_STEPS=200; REPEATS=20; MATMUL=8192; MODES=eager,compiled; LIMIT=1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$SUMMARY"
else
    # The same code paths at sizes a shared CPU runs in a minute or two (limits doubled).
    MODEL=pi05-tiny; BATCH=4; STEPS=2; TRAIN_STEPS=10; REPEATS=2; MATMUL=512; MODES=eager; LIMIT=2
fi
say "device $DEVICE, model $MODEL, torch $(python3 -c 'import torch; print(torch.__version__)'), stages $STAGES"

# run NAME SECONDS COMMAND...: one stage under its limit, its output in $LOGS/NAME.log.
run() {
    local name=$1 seconds=$(($2 * LIMIT))
    shift 2
    case ",$STAGES," in *",$name,"*) ;; *) return 0 ;; esac
    local started=$SECONDS
    timeout --kill-after=10 "$seconds" "$@" >"$LOGS/$name.log" 2>&1
    local code=$?
    local took=$((SECONDS - started))
    if [ $code -eq 0 ]; then
        say "$name: ok in ${took} s"
        tail -8 "$LOGS/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    elif [ $code -eq 124 ] || [ $code -eq 137 ]; then
        say "$name: stopped at its limit of ${seconds} s; the end of its log:"
        tail -5 "$LOGS/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    else
        say "$name: failed (exit $code) after ${took} s; the end of its log:"
        tail -5 "$LOGS/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    fi
}

# pi05 at its real sizes with random weights (no download): the engine's training step under
# torchrun, as a job of one GPU runs it (DDP for LoRA, FSDP2 for full).
run lora 120 torchrun --standalone --nproc-per-node 1 bench/bench_cuda_pi05.py \
    --model "$MODEL" --device "$DEVICE" --finetune lora --batch-size "$BATCH" --steps "$STEPS" --matmul-size "$MATMUL"
run full 150 torchrun --standalone --nproc-per-node 1 bench/bench_cuda_pi05.py \
    --model "$MODEL" --device "$DEVICE" --finetune full --batch-size "$BATCH" --steps "$STEPS" --matmul-size "$MATMUL"

# A local job on the device end to end (pi05-tiny: pi05's weights cannot be fetched there), then
# one started from its output.
DATASET=$WORK/dots
"${RELAY[@]}" datasets synth "$DATASET" --episodes 20 --length 20-30 >"$LOGS/synth.log" 2>&1 \
    || say "synth: the dataset could not be written; see synth.log"
run train 120 "${RELAY[@]}" local train --model pi05-tiny --dataset "$DATASET" --steps "$TRAIN_STEPS" \
    --batch-size "$BATCH" --device "$DEVICE" --output-dir "$WORK/run"
# (The help is read whole first: `grep -q` closing the pipe early fails the pipeline under pipefail.)
if [[ $("${RELAY[@]}" local train --help 2>/dev/null) == *--from-checkpoint* ]]; then
    run from_checkpoint 120 "${RELAY[@]}" local train --model pi05-tiny --from-checkpoint "$WORK/run" \
        --dataset "$DATASET" --steps "$TRAIN_STEPS" --batch-size "$BATCH" --device "$DEVICE" --output-dir "$WORK/again"
else
    case ",$STAGES," in *",from_checkpoint,"*) say "from_checkpoint: skipped (this Relay has no --from-checkpoint)" ;; esac
fi

# Serving latency at batch 1, 1/2/3 cameras, eager and compiled.
run latency 150 python3 bench/bench_cuda_latency.py --model "$MODEL" --device "$DEVICE" --repeats "$REPEATS" \
    --modes "$MODES"

rm -rf "$WORK"
say "logs: $LOGS"
! grep -qE ": (failed|stopped)" "$SUMMARY"
