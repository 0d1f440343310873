#!/usr/bin/env bash
# `ansible-test sanity` on the working tree as it is, uncommitted changes included (`make sanity`).
# Arguments go to ansible-test (e.g. `--test pylint`, `-v`). Needs only PyPI.
#
# ansible-test wants the collection at .../ansible_collections/sparkserve/dsv41 in a git repository
# (it lists the files through git), so the collection's files, tracked or untracked but not
# ignored, are copied into a temporary tree of that shape and committed there. "The collection's
# files" are those the built artifact holds (tests/sanity/collection_files.py reads galaxy.yml's
# build_ignore), plus galaxy.yml and tests/sanity/: not the lab, the other tests, the benchmarks,
# nor the collections/ link that lets the checkout import itself.
#
# ansible-test bootstraps pip in each virtualenv it builds with a get-pip.py that it downloads from
# a host these machines cannot reach, unless a copy is in its cache: this writes a stand-in there
# that takes pip from the interpreter's own ensurepip.
set -euo pipefail
cd "$(dirname "$0")/../.."

# The name follows the pip version that ansible-test pins: 24.2 in ansible-core 2.19 (see
# get_venv_packages in ansible_test/_internal/python_requirements.py and bootstrap in
# ansible_test/_util/target/setup/requirements.py). A real get-pip.py saved there is left alone.
cache=$HOME/.ansible/test/cache/get_pip_24_2.py
marker='# Stand-in for get-pip.py, written by tests/sanity/run.sh.'
if [[ ! -s $cache ]] || [[ $(head -n1 "$cache") == "$marker" ]]; then
  mkdir -p "$(dirname "$cache")"
  cat >"$cache" <<PY
$marker
# ansible-test runs it in each new virtualenv with get-pip.py's arguments. ensurepip installs the
# pip wheel that comes with Python, and on Python < 3.12 setuptools too, which ansible-test asks
# get-pip.py to leave out (--no-setuptools), so it is removed again.
import ensurepip
import subprocess
import sys

ensurepip.bootstrap(upgrade=True)
if '--no-setuptools' in sys.argv:
    subprocess.run([sys.executable, '-m', 'pip', 'uninstall', '--yes', '--quiet', 'setuptools'], check=True)
PY
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dest=$work/ansible_collections/sparkserve/dsv41
mkdir -p "$dest"
git ls-files -z --cached --others --exclude-standard |
  python3 tests/sanity/collection_files.py |
  while IFS= read -r -d '' path; do
    if [[ -e $path || -L $path ]]; then  # a file deleted but not yet staged is gone
      printf '%s\0' "$path"
    fi
  done |
  tar --create --no-recursion --null --files-from=- --file=- |
  tar --extract --file=- --directory="$dest"

# The controller is this virtualenv's Python (it has ansible-core); each test gets its own
# virtualenv under ~/.ansible/test/venv, kept between runs.
python=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
cd "$dest"
git init --quiet
git add --all
git -c user.name=sanity -c user.email=sanity@localhost commit --quiet --no-verify --message sanity
ansible-test sanity --python "$python" "$@"
