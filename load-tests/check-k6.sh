#!/usr/bin/env bash
# Syntax-check the k6 scripts (k6 itself cannot be installed on the project's machines).
# Parses every load-tests/k6/*.js as an ES2020 module with acorn from npm, installed once into
# /tmp/lt-npm; also checks that each scenario script exports options and a default function.
set -euo pipefail
LT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PREFIX=${LT_NPM_PREFIX:-/tmp/lt-npm}
ACORN="$PREFIX/node_modules/.bin/acorn"
if [ ! -x "$ACORN" ]; then
  mkdir -p "$PREFIX"
  npm install --silent --no-audit --no-fund --prefix "$PREFIX" acorn >/dev/null
fi
fail=0
for f in "$LT_DIR"/k6/*.js; do
  if "$ACORN" --ecma2020 --module --silent "$f"; then
    if [ "$(basename "$f")" != lib.js ]; then
      for want in 'export const options' 'export default function'; do
        if ! grep -q "$want" "$f"; then
          echo "FAIL $f: no '$want'"; fail=1
        fi
      done
    fi
    echo "ok   ${f#"$LT_DIR"/}"
  else
    echo "FAIL ${f#"$LT_DIR"/}"; fail=1
  fi
done
exit $fail
