#!/usr/bin/env bash
# Users install a wheel, not the checkout: build it, install it into a clean venv outside the source
# tree, import every module it ships, and run the README's example job from it.
set -euo pipefail
cd "$(dirname "$0")/.."
SOURCE="$PWD"
WORK="$(mktemp -d /tmp/elastic-wheel-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

# From a copy of the project's files only (a build/ folder left by an earlier build would hide a package
# the wheel misses).
mkdir "$WORK/src"
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$WORK/src"
# As a packager builds it: the source distribution, then the wheel built from that (a file the sdist
# misses is missing from the wheel too).
.venv/bin/python -m build --quiet --outdir "$WORK/dist" "$WORK/src" >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }
if grep -q -i "deprecat" "$WORK/build.log"; then
    grep -i -A3 "deprecat" "$WORK/build.log"
    echo "CI: the build warns of something deprecated (above)"
    exit 1
fi
.venv/bin/python - "$WORK"/dist/*.tar.gz "$WORK"/dist/*.whl <<'PY'
import sys, tarfile, zipfile

sdist, wheel = sys.argv[1], sys.argv[2]
names = {name.split("/", 1)[1] for name in tarfile.open(sdist).getnames() if "/" in name}
needed = ["README.md", "pyproject.toml", "tests/conftest.py", "docs/index.md", "examples/hello.py", "bench/recovery.py", ".ci/run"]
lacking = [name for name in needed if name not in names]
assert not lacking, f"the sdist lacks {lacking}: a packager could not run the tests from it"
shipped = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
extra = sorted(top for top in shipped if top not in ("rendezvous", "launcher", "elastic", "lighthouse") and ".dist-info" not in top)
assert not extra, f"the wheel ships {extra} besides the four packages"
print(f"CI: the sdist carries the tests and docs ({len(names)} files); the wheel built from it only the packages")
PY
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install --quiet --disable-pip-version-check "$WORK"/dist/*.whl
cp examples/hello.py "$WORK/hello.py"
cd "$WORK"
"$WORK/venv/bin/python" - "$SOURCE" <<'PY'
import importlib, os, pkgutil, sys

source = sys.argv[1]
found = []
for top in ("rendezvous", "launcher", "elastic", "lighthouse"):
    package = importlib.import_module(top)
    assert not package.__file__.startswith(source), f"{top} was imported from the checkout, not the wheel"
    found += [top] + [m.name for m in pkgutil.walk_packages(package.__path__, top + ".")]
shipped = {os.path.relpath(os.path.join(d, f), source)[:-3].replace(os.sep, ".")
           for top in ("rendezvous", "launcher", "elastic", "lighthouse")
           for d, _, files in os.walk(os.path.join(source, top)) for f in files if f.endswith(".py")}
shipped = {name[: -len(".__init__")] if name.endswith(".__init__") else name for name in shipped}
missing = sorted(shipped - set(found))
assert not missing, f"the wheel lacks {missing}"
optional = []  # modules for torch's own side (the torchrun plugin): they need torch, which is optional
for name in found:
    if name.endswith(("zygote", "reaper")):
        continue  # programs run by path, not imported
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name.split(".")[0] not in ("torch", "torchft"):
            raise
        optional.append(name)
print(f"CI: the wheel ships all {len(found)} modules; each imports ({len(optional)} need torch: {optional})")
PY
"$WORK/venv/bin/elastic-run" --standalone --nproc-per-node 2 hello.py
echo "CI: the README's example ran from the wheel"
"$WORK/venv/bin/elastic-lighthouse" --version
"$WORK/venv/bin/python" -m lighthouse --version  # how an agent's --lighthouse starts its replica
echo "CI: the Lighthouse's program runs from the wheel"
