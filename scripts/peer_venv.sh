#!/usr/bin/env bash
# Makes or reuses the Python venv that test and bench scripts compare strata against, and prints
# its python's path. strata itself never needs Python.
#
#   py=$(scripts/peer_venv.sh tokenizers [transformers torch ...]) || exit $?
#
# The venv is /tmp/strata-peer-venv (STRATA_PEER_VENV overrides), created with `python3 -m venv`
# (Debian: python3-venv) when missing; the packages it lacks are pip-installed quietly (a PKG may
# carry a version, e.g. tokenizers==0.21.0). Exits 77, the tests' skip code, with a message on
# stderr when the venv cannot be made or a package cannot be installed (e.g. no network).
# STRATA_PEER_SYSTEM_SITE=1 makes it from Debian's /usr/bin/python3 with --system-site-packages,
# so that Debian's python3-torch serves as the PyTorch.
set -uo pipefail
venv=${STRATA_PEER_VENV:-/tmp/strata-peer-venv}

# One maker at a time: two tests starting together would otherwise race in pip.
if command -v flock >/dev/null; then
  exec 9>"$venv.lock"
  flock 9
fi

if [ ! -x "$venv/bin/python" ]; then
  existed=no
  [ -e "$venv" ] && existed=yes
  make=(python3 -m venv)
  [ "${STRATA_PEER_SYSTEM_SITE:-0}" = 1 ] && make=(/usr/bin/python3 -m venv --system-site-packages)
  if ! "${make[@]}" "$venv" >&2; then
    echo "peer_venv.sh: cannot create the venv $venv (is python3-venv installed?)" >&2
    [ $existed = yes ] || rm -rf "$venv"  # only what this run made
    exit 77
  fi
fi

missing=()
for spec in "$@"; do
  name=${spec%%[<>=!~\[ ]*}
  "$venv/bin/python" -m pip show -q "$name" >/dev/null 2>&1 || missing+=("$spec")
done
if [ ${#missing[@]} -gt 0 ]; then
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "${missing[@]}" >&2; then
    echo "peer_venv.sh: cannot install ${missing[*]} into $venv (no network?)" >&2
    exit 77
  fi
fi
echo "$venv/bin/python"
