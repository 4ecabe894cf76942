// Loads the built bundle (dist/extension.js) against a stand-in for the "vscode" module and
// activates it with an interpreter that lacks the server: the commands are registered, one
// error names the interpreter and the pip command, and no client is started.
//
//   npm run build && node test/activation.test.mjs

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { activateWith } from './fakeVscode.mjs';

test('activation registers the commands and reports a missing server once', async () => {
  const seen = await activateWith({ trusted: true, interpreter: { globalValue: '/nonexistent/bin/python3' } });
  assert.deepEqual(seen.commands.sort(), [
    'precompile.emitArtifact',
    'precompile.recheckWorkspace',
    'precompile.restartServer',
    'precompile.showLogs',
    'precompile.verifyArtifact',
  ]);
  assert.deepEqual(seen.created, ['Precompile', 'Precompile Trace']);
  assert.equal(seen.errors.length, 1, JSON.stringify(seen.errors));
  const [{ message, buttons }] = seen.errors;
  assert.ok(message.includes('/nonexistent/bin/python3 -m pip install torch-precompile'), message);
  assert.deepEqual(buttons, ['Open Setting', 'Show Logs']);
  assert.equal(seen.item.id, 'precompile.status');
});

test('an interpreter that cannot import the server is named, with the pip command', async () => {
  // Node is a real executable that fails `-c "import precompile_lsp"`.
  const seen = await activateWith({ trusted: true, interpreter: { workspaceValue: process.execPath } });
  assert.equal(seen.errors.length, 1);
  assert.match(seen.errors[0].message, /cannot import precompile_lsp/);
  assert.ok(seen.errors[0].message.includes(`${process.execPath} -m pip install torch-precompile`));
});

test('an untrusted workspace cannot choose the interpreter', async () => {
  const seen = await activateWith({
    trusted: false,
    interpreter: { globalValue: '/user/bin/python3', workspaceValue: '/workspace/evil/python' },
  });
  assert.equal(seen.errors.length, 1);
  assert.ok(seen.errors[0].message.includes('/user/bin/python3'), seen.errors[0].message);
  assert.ok(!seen.errors[0].message.includes('/workspace/evil/python'));
});
