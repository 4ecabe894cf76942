// The built extension (dist/extension.js) with its real vscode-languageclient, against a
// stand-in for the "vscode" module, driving the real language server on a fresh copy of
// tests/fixtures/lsp_workspace: what it tells the server at initialize, and the status bar
// following `precompile/status` through a capture.
//
//   npm run build && PRECOMPILE_PYTHON=/path/to/python node test/client.test.mjs
//
// The interpreter is a generated shell wrapper that records what the client writes to the
// server's stdin and runs PRECOMPILE_PYTHON (default ../../.venv/bin/python) with the
// repository on PYTHONPATH.

import assert from 'node:assert/strict';
import { chmodSync, cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { after, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { activateWith } from './fakeVscode.mjs';

const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const REPO = resolve(PACKAGE, '..', '..');
const PYTHON = resolve(PACKAGE, process.env.PRECOMPILE_PYTHON || '../../.venv/bin/python');
const WAIT_MS = Number(process.env.PRECOMPILE_SMOKE_WAIT || 240) * 1000;

const root = mkdtempSync(join(tmpdir(), 'precompile-client-'));
after(() => rmSync(root, { recursive: true, force: true }));

function quote(value) {
  return `'${value.replace(/'/g, `'\\''`)}'`;
}

/** An "interpreter" that records the client's messages to `log`. */
function recordingInterpreter(name) {
  const log = join(root, `${name}.in`);
  const wrapper = join(root, `${name}-python`);
  writeFileSync(
    wrapper,
    [
      '#!/bin/sh',
      `export PYTHONPATH=${quote(REPO)}\${PYTHONPATH:+:$PYTHONPATH}`,
      `if [ "$1" = "-m" ]; then tee -a ${quote(log)} | ${quote(PYTHON)} "$@"; else exec ${quote(PYTHON)} "$@"; fi`,
      '',
    ].join('\n'),
  );
  chmodSync(wrapper, 0o755);
  const sent = () => (existsSync(log) ? readFileSync(log, 'utf8') : '');
  return { wrapper, sent };
}

function messages(raw) {
  return raw
    .split(/Content-Length: \d+\r\n\r\n/)
    .filter((part) => part.trim() !== '')
    .map((part) => JSON.parse(part));
}

test('a trusted workspace: trusted and the settings at initialize, capture progress in the status bar', async () => {
  const workspace = join(root, 'lab');
  cpSync(join(REPO, 'tests', 'fixtures', 'lsp_workspace'), workspace, { recursive: true });
  const { wrapper, sent } = recordingInterpreter('trusted');
  const seen = await activateWith(
    {
      trusted: true,
      interpreter: { globalValue: wrapper },
      folder: workspace,
      settings: { runOnSave: false, severity: { PC302: 'off' } },
    },
    (state) => /^\$\(warning\) Precompile: \d+$/.test(state.item?.text ?? '') || state.errors.length > 0,
    WAIT_MS,
  );
  assert.deepEqual(seen.errors, []);
  // tee writes the log after passing each message on: give the last one (exit) a moment.
  for (let i = 0; i < 50 && !/"method":\s*"exit"/.test(sent()); i++) {
    await new Promise((r) => setTimeout(r, 100));
  }
  const sentMessages = messages(sent());
  const initialize = sentMessages.find((m) => m.method === 'initialize');
  assert.deepEqual(initialize.params.initializationOptions, {
    trusted: true,
    settings: { runOnSave: false, severity: { PC302: 'off' } },
  });
  assert.equal(initialize.params.workspaceFolders.length, 1);
  const methods = sentMessages.map((m) => m.method);
  for (const method of ['initialized', 'shutdown', 'exit']) {
    assert.ok(methods.includes(method), `the client sent ${method} (${methods.join(', ')})`);
  }
  const texts = seen.texts;
  assert.ok(texts.some((t) => /^\$\(sync~spin\) Precompile \d+\/5$/.test(t)), `progress shown: ${texts.join(' | ')}`);
  assert.ok(texts.some((t) => /^\$\(warning\) Precompile: \d+$/.test(t)), `findings shown: ${texts.join(' | ')}`);
  assert.equal(texts.at(-1), '$(circle-slash) Precompile', 'stopped after deactivate');
});

test('an untrusted workspace: trusted false at initialize, "not trusted"; granting trust restarts trusted', async () => {
  const { wrapper, sent } = recordingInterpreter('untrusted');
  let granted = false;
  const seen = await activateWith(
    { trusted: false, interpreter: { globalValue: wrapper } },
    (state) => {
      const initialized = (sent().match(/"method":"initialized"/g) ?? []).length;
      if (initialized === 1 && !granted && state.texts.includes('$(shield) Precompile: not trusted')) {
        granted = true;
        state.grantTrust();
      }
      return initialized === 2;
    },
    60_000,
  );
  assert.deepEqual(seen.errors, []);
  // tee writes the log after passing each message on: give the last one (exit) a moment.
  for (let i = 0; i < 50 && !/"method":\s*"exit"/.test(sent()); i++) {
    await new Promise((r) => setTimeout(r, 100));
  }
  const sentMessages = messages(sent());
  const initializes = sentMessages.filter((m) => m.method === 'initialize');
  assert.deepEqual(
    initializes.map((m) => m.params.initializationOptions.trusted),
    [false, true],
    'the server restarted, told trusted=true',
  );
  const methods = sentMessages.map((m) => m.method);
  assert.ok(methods.indexOf('shutdown') > methods.indexOf('initialized'), 'the first server was shut down');
  assert.ok(seen.texts.includes('$(shield) Precompile: not trusted'), seen.texts.join(' | '));
});
