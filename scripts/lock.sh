#!/usr/bin/env bash
# Re-resolve one stack's pins: requirements/tfX.in -> requirements/lock-tfX.txt, in a
# throw-away venv (run when a pin in a .in file changes; setup.sh installs the lock).
# Usage: scripts/lock.sh 2.21|2.15
set -euo pipefail
cd "$(dirname "$0")/.."
TF=${1:?usage: scripts/lock.sh 2.21|2.15}
IN=requirements/tf$TF.in
[ -f "$IN" ] || { echo "lock.sh: no $IN" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 -m venv "$TMP/venv"
"$TMP/venv/bin/pip" install -q --upgrade "pip<25"
(cd requirements && "$TMP/venv/bin/pip" install -q -r "tf$TF.in")
{ echo "# Locked from $IN by scripts/lock.sh on $(date -u +%F); do not edit by hand."
  "$TMP/venv/bin/pip" freeze --exclude-editable; } > "requirements/lock-tf$TF.txt"
# packages of requirements/tfX-nodeps.txt are installed by setup.sh with --no-deps, not locked
echo "wrote requirements/lock-tf$TF.txt"
