#!/usr/bin/env bash
# The suite on another torch (issue 54): scripts/compat.sh TORCH_VERSION [--pin PKG==VERSION]... [--fresh] [PYTEST_ARGS...]
#
#   scripts/compat.sh 2.15.0                          the whole suite on torch 2.15.0
#   scripts/compat.sh 2.6.0 --pin numpy==1.24.4       ... with other packages held at a version (their floors)
#   scripts/compat.sh 2.11.0 tests/test_masks.py -x   ... or the pytest arguments given
#
# A venv of its own per torch (and pins), outside the repository: ${POSENC_COMPAT_DIR:-~/.cache/posenc-compat}/
# torch-VERSION[+PKG-VERSION...]. It is built once: torch first (the registry serves CUDA builds for most
# versions, several GB with its nvidia-* wheels; they run on a CPU too), then posenc with its test extras. A venv
# whose torch already matches is reused (--fresh rebuilds it), and every run reinstalls posenc editable from
# this checkout, so a re-run after a code change or a merge costs the suite alone. torch and the pins are held
# by a constraints file while posenc's requirements are installed, so nothing moves them.
#
# The suite runs as .ci/run runs it (the same environment, `python -m pytest -q` from the repository root);
# the last line gives pytest's counts and the wall time, also appended to results.log in the compat folder
# (pytest's whole output beside it, NAME.pytest.log; pip's, NAME.install.log). Not called by .ci/run, which
# stays on the pinned CPU build. Exit status: pytest's.
set -euo pipefail

usage() {
    echo "usage: scripts/compat.sh TORCH_VERSION [--pin PKG==VERSION]... [--fresh] [PYTEST_ARGS...]" >&2
    exit 2
}

# pip's output goes to the install log, shown only when it fails
pip_install() {
    "$python" -m pip install "$@" >> "$install_log" 2>&1 || {
        tail -n 30 "$install_log" >&2
        echo "error: pip install $* failed (the whole log: $install_log)" >&2
        exit 1
    }
}

installed_torch() {
    "$python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true
}

show_versions() {
    "$python" - <<'EOF'
import importlib.metadata as md
names = ["torch", "numpy", "triton", "hydra-core", "datasets", "wandb", "scipy", "matplotlib", "safetensors",
         "tokenizers", "transformers", "fla-core"]
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "-"
print("compat:", ", ".join(f"{n} {version(n)}" for n in names))
EOF
}

# all of it in functions, read whole before anything runs: editing this file during a run (the suite
# takes minutes) cannot change the run
main() {
    [[ $# -ge 1 ]] || usage
    torch_version=$1
    shift
    [[ $torch_version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || {
        echo "error: TORCH_VERSION is X.Y.Z (e.g. 2.15.0), got '$torch_version'" >&2
        exit 2
    }
    pins=()
    fresh=0
    while [[ $# -gt 0 ]]; do
        case $1 in
            --pin) [[ $# -ge 2 ]] || usage; pins+=("$2"); shift 2 ;;
            --pin=*) pins+=("${1#--pin=}"); shift ;;
            --fresh) fresh=1; shift ;;
            --) shift; break ;;
            *) break ;;
        esac
    done
    name="torch-$torch_version"
    for pin in ${pins[@]+"${pins[@]}"}; do
        [[ $pin =~ ^[A-Za-z0-9._-]+==[A-Za-z0-9.+_-]+$ ]] || { echo "error: --pin takes PKG==VERSION, got '$pin'" >&2; exit 2; }
        name+="+${pin/==/-}"
    done

    repo=$(cd "$(dirname "$0")/.." && pwd)
    root=${POSENC_COMPAT_DIR:-$HOME/.cache/posenc-compat}
    venv=$root/$name
    python=$venv/bin/python
    install_log=$root/$name.install.log
    mkdir -p "$root"

    # what pip must not move: torch and the pins. Given as PIP_CONSTRAINT, this file also replaces a
    # constraints file named in pip's own configuration (some machines cap torch there)
    constraints=$root/$name.constraints.txt
    printf '%s\n' "torch==$torch_version" ${pins[@]+"${pins[@]}"} > "$constraints"
    export PIP_CONSTRAINT=$constraints PIP_DISABLE_PIP_VERSION_CHECK=1

    if [[ $fresh == 1 || ! -x $python || $(installed_torch) != "$torch_version" ]]; then
        echo "compat: building $venv (torch $torch_version${pins[*]+ with ${pins[*]}})"
        rm -rf "$venv"
        : > "$install_log"
        python3 -m venv "$venv"
        pip_install --upgrade pip
        # torch first, alone, so that nothing else picks its build; not cached (several GB per version)
        pip_install --no-cache-dir "torch==$torch_version"
        [[ $(installed_torch) == "$torch_version" ]] || { echo "error: torch $torch_version did not install into $venv" >&2; exit 1; }
    else
        echo "compat: reusing $venv"
    fi
    # posenc from this checkout (editable: the tests import it from here), its requirements and the pins
    pip_install -e "$repo[test]" ${pins[@]+"${pins[@]}"}
    show_versions

    cd "$repo"
    # as .ci/run: the venv active (tests run scripts that call python3) and the same environment
    export VIRTUAL_ENV=$venv PATH=$venv/bin:$PATH
    export WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
    local log=$root/$name.pytest.log start status wall summary line
    start=$(date +%s)
    set +e
    "$python" -m pytest -q "$@" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    set -e
    wall=$(( $(date +%s) - start ))
    summary=$(grep -E '^=*.*[0-9]+ (passed|failed|errors?|skipped|deselected|xfailed)|no tests ran' "$log" | tail -n 1 \
              | sed -E 's/^=+ //; s/ =+$//')
    line="torch $torch_version${pins[*]+ (${pins[*]})}: ${summary:-no summary (pytest exit $status)}; wall ${wall}s;"
    line+=" $(git describe --always --dirty 2>/dev/null || echo '?') $(date -u +%FT%TZ)"
    echo "compat: $line"
    echo "$line" >> "$root/results.log"
    return "$status"
}

main "$@"; exit  # one line: bash reads no further, whatever this file becomes during the run
