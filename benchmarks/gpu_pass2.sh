#!/usr/bin/env bash
# The second GPU pass (issue 49; docs/accelerators.md, "The second GPU pass"): four sections in
# this order, each under its own time limit and writing its output into OUT as it ends, so a
# call cut short keeps what finished:
#   suite      tests/attention, kernels, recurrent, models at JAX's default matmul precision,
#              less the tests of PASSED (one node id a line; default: the 426 that passed on
#              the H200 in pass 2, results/accelerator/h200_pass2/passed.txt; PASSED= runs
#              all): each test's outcome as it ends (-v), the failures named (-rfE), JUnit XML
#                                                                                      210 s
#   listops    S5's ListOps recipe (listops preset s5) resumed from the workdir committed in
#              results/exploratory/listops_s5/workdir.tar.gz (a fresh start, said so, where
#              there is none); LRA's data redrawn on every core first (tools/listops_lra_data.py);
#              SIGTERM at the limit, on which the runtime saves; the workdir comes back packed 270 s
#   attention  the attention table at L = 8 192 and 32 768: causal, window, window + 16 global,
#              BigBird; our Triton kernel split and not, its d = 128 tilings; cuDNN, SDPA  110 s
#   recurrent  the recurrent table's four shapes (16 rows, each compiles: about 9 s a row)
#              against torch's cuDNN (flattened weights, bfloat16 included); LRU and S5
#              parallel against stepwise at T = 4 096 and 16 384 (pass 2 measured 1 024)
#                                                                                 170 + 80 s
#
#   bash benchmarks/gpu_pass2.sh OUT [SECTIONS]         SECTIONS: a comma list, default all four
#   PYTHON=.venv/bin/python REHEARSE=1 bash benchmarks/gpu_pass2.sh OUT    a CPU, tiny sizes
#
# The next session (15 minutes of device time, the machine's start included): two calls, the
# second at once on the machine the first left warm (docs/accelerators.md):
#   suite,listops  timeout_s=550        recurrent  timeout_s=270
# The attention section is left out of them: its kernels did not change after pass 2.
#
# On the GPU machine it installs the wheels of .whl/ the image lacks (benchmarks/gpu_env.sh;
# carry .whl). OUT gets at most 7 files (the device machine returns 8): pass2.md (the machine;
# each section's command, seconds and exit status), suite_core.log, suite_core.xml,
# listops_s5.log, listops_s5_workdir.tar.gz, attention.log, recurrent.log.
set -u
out=${1:?usage: bash benchmarks/gpu_pass2.sh OUT [suite,listops,attention,recurrent]}
sections=${2:-suite,listops,attention,recurrent}
rehearse=${REHEARSE:-}
py=${PYTHON:-python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary="$out/pass2.md"

if [ -z "$rehearse" ]; then
  source benchmarks/gpu_env.sh
else
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
fi
unset JAX_DEFAULT_MATMUL_PRECISION     # the suite at JAX's default precision (TF32 on a GPU)
{
  echo "# The second GPU pass, $(date -u +%Y-%m-%dT%H:%MZ)${rehearse:+ (a CPU rehearsal)}"
  echo
  echo '```'
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  else
    echo "no nvidia-smi"
  fi
  edited=$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo +)
  echo "commit $(git rev-parse --short HEAD 2>/dev/null)$edited"
  "$py" -c "import sys, jax, flax, torch; print('python', sys.version.split()[0], '| jax',
    jax.__version__, jax.devices()[0].device_kind, '| flax', flax.__version__, '| torch',
    torch.__version__)" 2>&1 | tail -1
  echo '```'
  echo
  echo "| section | command | seconds | exit status |"
  echo "|---|---|---|---|"
} > "$summary"

want() { [[ ",$sections," == *",$1,"* ]]; }

# run NAME LIMIT SIGNAL LOG COMMAND...: COMMAND under `timeout` (SIGNAL to it alone after
# LIMIT seconds, SIGKILL 30 s later), its output appended to LOG, a row in pass2.md
run() {
  local name=$1 limit=$2 signal=$3 log=$4 start=$SECONDS status shown
  shift 4
  echo "\$ $*" >> "$log"
  timeout --foreground -s "$signal" -k 30 "$limit" "$@" >> "$log" 2>&1
  status=$?
  shown=$status
  [ $status = 124 ] && shown="124 (time limit)"
  echo "| $name | \`$*\` | $((SECONDS - start)) | $shown |" >> "$summary"
  return $status
}

if want suite; then
  tests=(tests/attention tests/kernels tests/recurrent tests/models)
  workers=14 limit=210
  if [ -n "$rehearse" ]; then   # the tests of one file that did not pass on the H200
    tests=(tests/attention/test_implementations.py)
    workers=2 limit=120
  fi
  passed=${PASSED-results/accelerator/h200_pass2/passed.txt}
  if [ -n "$passed" ]; then     # deselected: pytest reads the arguments of an @file
    deselect=$(mktemp --suffix=.args)
    sed 's/^/--deselect=/' "$passed" > "$deselect"
    tests=("@$deselect" "${tests[@]}")
    echo "deselected: the $(wc -l < "$passed") tests of $passed (@${deselect})" >> "$summary"
  fi
  run suite "$limit" INT "$out/suite_core.log" "$py" -m pytest -p no:cacheprovider -n "$workers" \
    --dist loadgroup -v -rfE --junitxml="$out/suite_core.xml" "${tests[@]}"
fi

if want listops; then
  log="$out/listops_s5.log" start=$SECONDS limit=270
  states=tools/listops_lra_states.json
  runs=runs tarball=results/exploratory/listops_s5/workdir.tar.gz data=data/listops
  config=(--config=experiments/listops.py:preset=s5 --config.train.keep_checkpoints=1)
  if [ -n "$rehearse" ]; then   # a recipe of 64 short trees, a one-block model: a stop and a resume
    runs=runs/pass2_rehearsal tarball=runs/pass2_rehearsal/workdir.tar.gz
    states=$runs/states.json data=$runs/data/listops-len20-100-n48-8-8-seed0 limit=150
    rm -rf "$runs" && mkdir -p "$runs"
    "$py" -c "import json, sys; sys.path.insert(0, 'tools'); import listops_lra_data as t; json.dump(t.snapshot(0, (('train', 48), ('val', 8), ('test', 8)), (20, 100), 16), open('$states', 'w'))"
    config+=(--config.data.dir=$runs/data --config.data.min_tree_length=20
             --config.data.max_tree_length=100 --config.data.train_examples=48
             --config.data.eval_examples=8 --config.data.test_examples=8
             --config.data.max_length=100 --config.model.num_layers=1 --config.model.hidden_size=32
             --config.train.batch_size=8 --config.train.num_steps=100000 --config.train.eval_every=50
             --config.train.checkpoint_every=50 --config.train.log_every=10)
  fi
  if [ ! -f "$data/test.tsv" ]; then
    run "listops data" 120 TERM "$log" "$py" tools/listops_lra_data.py generate "$states" "$data"
  fi
  rm -rf "$runs/listops_s5" && mkdir -p "$runs"
  if [ -f "$tarball" ]; then
    tar -xzf "$tarball" -C "$runs" && echo "resuming the workdir of $tarball" >> "$log"
  else
    echo "no checkpoint in the repository ($tarball): the run starts fresh" | tee -a "$log" >> "$summary"
  fi
  train() {
    run "listops s5" "$1" TERM "$log" "$py" launch.py "${config[@]}" --workdir="$runs/listops_s5"
    tar -czf "$out/listops_s5_workdir.tar.gz" -C "$runs" listops_s5
  }
  if [ -n "$rehearse" ]; then   # stopped by SIGTERM, packed, unpacked as the next call would
    train 60
    rm -rf "$runs/listops_s5" && tar -xzf "$out/listops_s5_workdir.tar.gz" -C "$runs"
    train 45
  else
    train $((limit - (SECONDS - start) - 15))
  fi
fi

if want attention; then
  args=(--gpu_shapes=8192,32768 --patterns=causal,window,global,bigbird
        --candidates=auto,pallas_gpu,cudnn,jax_cudnn,torch --variants=all --repeats=3)
  limit=110
  if [ -n "$rehearse" ]; then
    args=(--rehearse --gpu_shapes=32768 --patterns=causal,global,bigbird
          --candidates=auto,pallas_gpu,cudnn,jax_cudnn,torch --variants=all --repeats=1 --inner=1)
    limit=400
  fi
  run attention "$limit" TERM "$out/attention.log" "$py" benchmarks/attention.py "${args[@]}"
fi

if want recurrent; then
  cells=(--shapes=stack_bidir,wide_stack_bidir,base,long_bidir --peers=torch --repeats=7)
  linear=(--section=linear --lengths=4096,16384 --linear_layers=LRU,S5 --linear_repeats=5
          --compile_target=)
  limits=(170 80)
  if [ -n "$rehearse" ]; then
    cells=(--shapes=base --cells=lstm --dtypes=float32 --peers=torch --repeats=1)
    linear=(--section=linear --lengths=256 --linear_layers=LRU,S5 --linear_repeats=1
            --compile_target=)
    limits=(240 240)
  fi
  run "recurrent cells" "${limits[0]}" TERM "$out/recurrent.log" "$py" benchmarks/recurrent.py "${cells[@]}"
  run "recurrent linear" "${limits[1]}" TERM "$out/recurrent.log" "$py" benchmarks/recurrent.py "${linear[@]}"
fi
echo "done: $summary"
