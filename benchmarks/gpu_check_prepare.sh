#!/usr/bin/env bash
# Download, on this machine, the wheels benchmarks/gpu_check needs and the lent H200 lacks, into
# .whl/ of this checkout (git-ignored through .git/info/exclude), for the device run tool's
# `carry` (docs/scale.md "A GPU check"). That machine has Python 3.12, torch 2.11 and
# transformers 5.17 and reaches no registry; its image lacks pydantic (specdraft.core.profile,
# specdraft.train.config), whose compiled core must be the cp312 x86-64 build. The versions are
# those of this checkout's venv (what the tests ran with); typing_extensions too, since this
# pydantic wants a newer one than the image may hold. specdraft itself travels as source (src/).
#
#   benchmarks/gpu_check_prepare.sh [PYTHON]     # PYTHON: the venv's, default .venv/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
PACKAGES="pydantic pydantic_core annotated_types typing_inspection typing_extensions"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.whl/' "$exclude" 2> /dev/null || echo '/.whl/' >> "$exclude"
rm -rf .whl && mkdir .whl
specs=()
for pkg in $PACKAGES; do
    version=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$pkg")
    specs+=("$pkg==$version")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${specs[@]}"
ls -l .whl
du -sh .whl
