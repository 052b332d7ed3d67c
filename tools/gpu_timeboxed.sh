#!/bin/bash
# Time-boxed GPU evidence run, for when the device time left is short (tools/gpu_check.sh is the
# complete run): build, every C++ test suite, compute-sanitizer memcheck of the C++ suite, pytest per
# file restricted by PYK (default: the CUDA cases; the CPU cases run in CI),
# then the report one op at a time (REPORT_OPS) while time is left (BUDGET seconds, default 560),
# each op's JSON in OUT/report/, and the demo when DEMO holds its arguments. Results come home with
#   python bench/record.py save report/<op>.json
#   BUDGET=545 DEMO="--device cuda --dtype bf16 --steps 30" tools/gpu_timeboxed.sh OUT
# STAGES picks and orders the stages after the build (default "tests report demo"; "tests" is
# memcheck, which runs every C++ test, beside pytest; "gtest", "memcheck", "pytest" also stand alone;
# "cluster_sanitize" is racecheck and synccheck of small calls of the Hopper per-token backward);
# GTEST_SUITES (regex: the C++ suites of gtest and memcheck) and PYFILES (test files) narrow the tests.
# BUILD_TESTS=ON builds the C++ test binary ($TESTS) for a custom stage without gtest/memcheck.
# REPORT_ARGS go to every report.py call (e.g. "--skip fla --cases REGEX").
# DEMO_TIMEOUT and REPORT_TIMEOUT cap the demo's and each report op's seconds (default: all left).
# Run from an exported tree with .commit (the commit id), .whl/ and .gpu/googletest as for gpu_check.
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"; cd "$ROOT"
OUT=$1; T0=$(date +%s); W=/tmp/fo; L=$W/logs; rm -rf $L; mkdir -p $L/gtest $L/pytest $OUT/report
S=$OUT/summary.txt; : > $S
left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
note() { echo "$*" | tee -a $S; }
# Files the run needs are checked before the device time goes to a build: a path listed in
# .git/info/exclude does not travel to the device (only tracked files, untracked ones that git
# does not ignore, and the carried paths), and a stop-64 call built and ran nothing for that.
[ -f .commit ] || { echo "gpu_timeboxed: no .commit here (write it with git rev-parse HEAD; it must not be git-ignored)"; exit 2; }
if [ -n "${CUSTOM:-}" ] && [ ! -f "$CUSTOM" ]; then
  echo "gpu_timeboxed: CUSTOM=$CUSTOM not found here (an ignored file does not travel)"; exit 2; fi
export FUSEDOPS_COMMIT="$(cat .commit)"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; python3 -c 'import torch;print("torch", torch.__version__)'; } | tee -a $S
note "commit $FUSEDOPS_COMMIT"
# Peers (fla, FlashQLA, Liger and their dependencies): an unpacked site folder (.gpu/peers-site.tar.xz,
# made where pip can reach PyPI) or wheels in .whl/. oneDNN (required by the build): a prefix
# (.gpu/onednn-prefix.tar.xz) or its two gomp wheels in .whl/.
if [ -f .gpu/peers-site.tar.xz ]; then tar xJf .gpu/peers-site.tar.xz -C $W || note "peer site unpack failed"
elif compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target $W/site .whl/*.whl >$L/wheels.log 2>&1 || note "wheel install failed"; fi
DNNL=()
if [ -f .gpu/onednn-prefix.tar.xz ]; then tar xJf .gpu/onednn-prefix.tar.xz -C $W && DNNL=(-Ddnnl_ROOT=$W/onednn)
elif compgen -G ".whl/onednn*gomp*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --prefix $W/dnnl .whl/onednn*gomp*.whl >$L/onednn.log 2>&1 && DNNL=(-Ddnnl_ROOT=$W/dnnl); fi
STAGES=${STAGES:-tests report demo}
case " $STAGES " in *" gtest "*|*" memcheck "*|*" tests "*) BT=ON;; *) BT=${BUILD_TESTS:-OFF};; esac
cmake -S . -B $W/build -G Ninja -DFUSEDOPS_CUDA=ON -DFUSEDOPS_CUDA_ARCHS=90a -DFUSEDOPS_BUILD_TESTS=$BT -DFUSEDOPS_BUILD_PYTHON=ON \
  -DPython_EXECUTABLE="$(command -v python3)" -DFUSEDOPS_GTEST_SOURCE_DIR=$ROOT/.gpu/googletest "${DNNL[@]}" >$L/cmake.log 2>&1 || { tail -20 $L/cmake.log; exit 1; }
tools/touch_changed.sh $W/build | tee -a $S
cmake --build $W/build -j 16 >$L/build.log 2>&1 || { grep -B2 -A8 error $L/build.log | head -40 | tee -a $S; exit 1; }
note "build done at $(( $(date +%s) - T0 )) s"
rm -rf $W/py && mkdir -p $W/py && cp -r python/fusedops $W/py/ && cp $W/build/_C*.so $W/py/fusedops/
export PYTHONPATH=$W/py:$W/site PYTHONUNBUFFERED=1
TESTS=$W/build/fusedops_tests
# The test stages run a process per C++ suite (8 at a time) and per Python file (4 at a time): one
# GPU shares them well, and one fault stays in its process. A whole-suite memcheck in one process
# ran past its 240 s box on an H100 (stop of 2026-12-05); per suite, memcheck and pytest together
# took 197 s there.
export TESTS L PYK="${PYK:-cuda}" PYTEST_TIMEOUT="${PYTEST_TIMEOUT:-200}" MEMCHECK_TIMEOUT="${MEMCHECK_TIMEOUT:-200}"
suites() { $TESTS --gtest_list_tests | grep -E '^[A-Za-z0-9_]+\.$' | tr -d '.' | grep -E "${GTEST_SUITES:-.}"; }
one_gtest() {
  if $TESTS --gtest_filter="$1.*" >$L/gtest/$1.log 2>&1; then echo "gtest $1 ok"; else
    echo "FAILED gtest $1"; grep -E "Failure|error|Expected|Which is|FAILED  \]" $L/gtest/$1.log | head -12 | cut -c1-300; fi
}
# compute-sanitizer exits 255 for a suite that makes no CUDA call ("terminated before first
# instrumented API call"): its tests' own result decides then.
one_memcheck() {
  timeout $MEMCHECK_TIMEOUT compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 10 $TESTS \
    --gtest_filter="$1.*" >$L/memcheck/$1.log 2>&1
  echo "memcheck $1 rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck/$1.log | tail -1) $(grep -E '^\[  (PASSED|FAILED)  \]' $L/memcheck/$1.log | head -2 | tr '\n' ' ')"
}
one_pytest() {
  local name; name=$(basename $1 .py)${PYTAG:-}
  timeout $PYTEST_TIMEOUT python3 -m pytest $1 -q -p no:cacheprovider -k "$PYK" >$L/pytest/$name.log 2>&1
  local rc=$?; [ $rc = 5 ] && return  # no test of this file matched PYK
  echo "pytest $name rc=$rc: $(tail -1 $L/pytest/$name.log | cut -c1-120)"
  [ $rc = 0 ] || grep -E "^(FAILED|ERROR)|Fatal Python|^E  " $L/pytest/$name.log | head -8 | cut -c1-300
}
export -f one_gtest one_memcheck one_pytest
stage_gtest() {
suites | xargs -P 8 -I{} bash -c 'one_gtest {}' | sort | tee -a $S | grep -v " ok$" || true
note "gtest: $(cat $L/gtest/*.log | grep -c '^\[       OK') OK, $(cat $L/gtest/*.log | grep -c '^\[  FAILED  \] [A-Za-z]*\.[A-Za-z]* (') failed, at $(( $(date +%s) - T0 )) s"
}
stage_memcheck() {
mkdir -p $L/memcheck
suites | xargs -P 8 -I{} bash -c 'one_memcheck {}' | sort > $L/memcheck_summary.txt
grep -vE "rc=0 .*ERROR SUMMARY: 0 errors" $L/memcheck_summary.txt | tee -a $S
note "memcheck: $(grep -cE 'rc=0 .*ERROR SUMMARY: 0 errors' $L/memcheck_summary.txt) of $(wc -l < $L/memcheck_summary.txt) suites clean, at $(( $(date +%s) - T0 )) s"
}
pyfiles() { printf '%s\n' ${PYFILES:-$(find tests/python -name 'test_*.py' -not -path '*/distributed/*' -not -path '*/transformers/*' | sort)}; }
# The cases past 2^31 elements (test names with past_int32) hold up to ~77 GiB of one card: beside
# other test processes on an 80 GB H100 one ran out of memory (2026-12-06), so they run after the
# other cases, one file at a time (only the files that have such cases), their logs tagged -big.
stage_pytest_main() {
pyfiles | PYK="($PYK) and not past_int32" xargs -P 4 -I{} bash -c 'one_pytest {}' | sort | tee -a $S
}
stage_pytest_big() {
pyfiles | xargs grep -l past_int32 | PYK="($PYK) and past_int32" PYTAG=-big xargs -P 1 -I{} bash -c 'one_pytest {}' | tee -a $S
note "pytest done at $(( $(date +%s) - T0 )) s"
}
stage_pytest() { stage_pytest_main; stage_pytest_big; }
# memcheck (which also runs every C++ test) beside pytest; the large cases once both are done.
stage_tests() {
stage_memcheck & local mc=$!
stage_pytest_main
wait $mc
stage_pytest_big
}
stage_report() {
for op in ${REPORT_OPS:-matmul_add clipped_swiglu rmsnorm_gated fused_cross_entropy_loss sort_chunks_by_idx rmsnorm_without_weight l2norm causal_conv1d mhc chunk_loss chunk_gated_delta_rule chunk_kda}; do
  l=$(left); [ $l -lt 40 ] && { note "report $op skipped (time)"; continue; }
  timeout $(( l - 30 < ${REPORT_TIMEOUT:-100000} ? l - 30 : ${REPORT_TIMEOUT:-100000} )) python3 bench/report.py --device cuda --ops $op ${REPORT_ARGS:-} --json $OUT/report/$op.json >$L/report-$op.log 2>&1
  rc=$?; cp $L/report-$op.log $OUT/report/; note "report $op rc=$rc at $(( $(date +%s) - T0 )) s"; grep -E "speed|x |TB/s|ms" $L/report-$op.log | tail -8 | cut -c1-200 >> $S
done
}
stage_demo() {
l=$(left)
if [ $l -gt 60 ] && [ -n "${DEMO:-}" ]; then
  timeout $(( l - 10 < ${DEMO_TIMEOUT:-100000} ? l - 10 : ${DEMO_TIMEOUT:-100000} )) python3 examples/train_hybrid.py $DEMO --json $OUT/train_hybrid.json >$L/demo.log 2>&1
  rc=$?; cp $L/demo.log $OUT/; note "demo rc=$rc"; tail -15 $L/demo.log >> $S
fi
}
# Stage "cluster_sanitize": racecheck and synccheck of cuda_sm90's per-token backward on small
# cluster calls (tools/debug/recurrent_cluster_calls.py; the test suite's shapes are too slow there).
stage_cluster_sanitize() {
for tool in racecheck synccheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 99 python3 tools/debug/recurrent_cluster_calls.py >$L/$tool.log 2>&1
  note "$tool rc=$? $(grep -E 'SUMMARY' $L/$tool.log | tail -1) at $(( $(date +%s) - T0 )) s"
  grep -E "^fused_recurrent" $L/$tool.log >> $S
done
}
# Stage "custom": the commands of the file $CUSTOM, run here with this script's variables.
stage_custom() { [ -n "${CUSTOM:-}" ] && . "$CUSTOM"; note "custom done at $(( $(date +%s) - T0 )) s"; }
for st in $STAGES; do stage_$st; done
tar czf $OUT/logs.tgz -C $W logs
# Few files come back from the device (at most 8, 16 MiB each): the per-op results travel as one
# archive, and when the custom stage left more than five other files in OUT they travel as
# extra.tgz (a stop-21 profile was lost to that limit).
tar czf $OUT/report.tgz -C $OUT report && rm -rf $OUT/report
note "total $(( $(date +%s) - T0 )) s"
extra=$(cd $OUT && ls -A | grep -vxE 'summary.txt|logs.tgz|report.tgz')
if [ $(printf '%s\n' "$extra" | grep -c .) -gt 5 ]; then
  (cd $OUT && tar czf extra.tgz $extra && rm -rf $extra)
  echo "more than 5 extra files: packed into extra.tgz ($(du -h $OUT/extra.tgz | cut -f1))" >> $S
fi
