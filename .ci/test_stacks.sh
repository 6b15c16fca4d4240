#!/usr/bin/env bash
# The test suite on both supported stacks; fails if either fails.
#
# 1. pinned stack: the active Python (3.10/3.11; JAX 0.10, ArviZ 0.x), the test suite less the
#    validation suite (-m "not slow and not heavy"), docs build included.
# 2. current stack: a virtual environment (.venv-current) built from Python 3.12 (else 3.13; pyenv's,
#    else one on PATH) with `pip install -e ".[test]"` and no version constraints (today's JAX,
#    NumPyro, ArviZ 1.x), what differs between the stacks and a sample of the statistical tests
#    (-m "stacks and not slow and not heavy": tests/conftest.py, CURRENT_STACK).
#
# The statistical validation suite (-m "slow or heavy") is .ci/validate.
#
# Environment: PYTHON (the pinned stack's interpreter, default `python`), NSG_CURRENT_PYTHON
# (the current stack's interpreter, default: found as above), NSG_REQUIRE_BOTH_STACKS=1 (fail,
# instead of warning, when no Python 3.12/3.13 is found), NSG_STACKS ("pinned current" by
# default; "current" runs the current stack only), NSG_NO_INSTALL=1 (use the pinned stack as
# installed, without `pip install`), NSG_TEST_WORKERS (pytest-xdist workers, default `auto`: one per
# core; 0: one process).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
STACKS=${NSG_STACKS:-pinned current}
VENV=.venv-current
# pytest-xdist: one worker per core, each test file on one worker (its module fixtures shared);
# NSG_TEST_WORKERS=0 runs in one process
WORKERS="-n ${NSG_TEST_WORKERS:-auto} --dist loadfile"
[[ "${NSG_TEST_WORKERS:-auto}" == 0 ]] && WORKERS="-p no:xdist"
failed=()

find_current_python() {
    if [[ -n "${NSG_CURRENT_PYTHON:-}" ]]; then echo "$NSG_CURRENT_PYTHON"; return 0; fi
    local root=""
    if command -v pyenv >/dev/null 2>&1; then root=$(pyenv root); else root="$HOME/.pyenv"; fi
    local minor candidate
    for minor in 3.12 3.13; do
        for candidate in $(ls -d "$root"/versions/"$minor"* 2>/dev/null | sort -V -r); do
            if [[ -x "$candidate/bin/python" ]]; then echo "$candidate/bin/python"; return 0; fi
        done
        if command -v "python$minor" >/dev/null 2>&1; then command -v "python$minor"; return 0; fi
    done
    return 1
}

run_pinned() {
    echo "=== pinned stack: $($PYTHON --version 2>&1) ==="
    if [[ "${NSG_NO_INSTALL:-0}" != 1 ]]; then $PYTHON -m pip install -q -e ".[test,docs]" || return 1; fi
    $PYTHON -c "import jax, numpyro, arviz; print('jax', jax.__version__, '| numpyro', numpyro.__version__, '| arviz', arviz.__version__)"
    $PYTHON -m pytest -q -m "not slow and not heavy" -p no:cacheprovider --durations=25 $WORKERS
}

run_current() {
    local py
    if ! py=$(find_current_python); then
        echo "!!! no Python 3.12 or 3.13 found (pyenv versions or python3.12/python3.13 on PATH):"
        echo "!!! the current stack (newest JAX/NumPyro/ArviZ 1.x) was NOT tested."
        echo "!!! Install one (pyenv install 3.12) or set NSG_CURRENT_PYTHON=/path/to/python3.12."
        [[ "${NSG_REQUIRE_BOTH_STACKS:-0}" == 1 ]] && return 1
        return 77  # skipped (pytest never exits with 77)
    fi
    echo "=== current stack: $($py --version 2>&1) ($py), venv $VENV ==="
    if [[ ! -x "$VENV/bin/python" ]]; then "$py" -m venv "$VENV" || return 1; fi
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1
    "$VENV/bin/python" -m pip install -q --upgrade --upgrade-strategy eager -e ".[test]" || return 1
    "$VENV/bin/python" -c "import jax, numpyro, arviz; print('jax', jax.__version__, '| numpyro', numpyro.__version__, '| arviz', arviz.__version__)"
    "$VENV/bin/python" -m pytest -q -m "stacks and not slow and not heavy" -p no:cacheprovider --durations=25 $WORKERS
}

start=$SECONDS
for stack in $STACKS; do
    t0=$SECONDS
    "run_$stack"
    case $? in
        0) status=passed ;;
        77) status="SKIPPED (no Python 3.12/3.13)" ;;
        *) status=FAILED; failed+=("$stack") ;;
    esac
    echo "=== $stack stack: $status in $(( (SECONDS - t0) / 60 )) min $(( (SECONDS - t0) % 60 )) s ==="
done
echo "=== all stacks: $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s in total ==="
if (( ${#failed[@]} )); then echo "FAILED on: ${failed[*]}"; exit 1; fi
