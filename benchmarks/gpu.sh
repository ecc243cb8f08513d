#!/usr/bin/env bash
# Every GPU check of issue 30 in one run: benchmarks/gpu.py does the work (--help lists
# the options; --dry-run runs it on a CPU). Python: $PYTHON, else the repository's .venv,
# else python3 (on a lent GPU machine, the one that holds PyTorch). On that machine:
#   run(command="bash benchmarks/gpu.sh --out $OUT", carry=[".whl"], timeout_s=560)
# after `bash benchmarks/gpu_wheels.sh` here.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-}"
if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
if [ -d .whl ] && ! "$py" -c "import zmq, gymnasium, ale_py, jsonschema" 2>/dev/null; then
    # A lent GPU machine: no network, torch but not zmqrl's other needs. Install the
    # wheels benchmarks/gpu_wheels.sh fetched, and zmqrl itself for its entry points
    # (every built-in part is found through them), into /tmp/site.
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    "$py" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir \
        --target /tmp/site .
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$py" benchmarks/gpu.py "$@"
