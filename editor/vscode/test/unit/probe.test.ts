import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { runProbe } from '../../src/probe';

// Node stands in for Python: the probe only cares how the process exits.
describe('runProbe', () => {
  it('is ok when the command exits 0', async () => {
    const result = await runProbe({ command: process.execPath, args: ['-e', ''], options: { env: {} } });
    assert.deepEqual(result, { ok: true, notFound: false, detail: '' });
  });

  it('fails with stderr when it exits non-zero', async () => {
    const result = await runProbe({
      command: process.execPath,
      args: ['-e', 'console.error("ModuleNotFoundError: precompile_lsp"); process.exit(1)'],
      options: { env: {} },
    });
    assert.equal(result.ok, false);
    assert.equal(result.notFound, false);
    assert.match(result.detail, /ModuleNotFoundError/);
  });

  it('says when the interpreter does not exist', async () => {
    const result = await runProbe({ command: '/nonexistent/bin/python3', args: ['-c', 'pass'], options: { env: {} } });
    assert.equal(result.ok, false);
    assert.equal(result.notFound, true);
  });

  it('fails when it runs past the timeout', async () => {
    const result = await runProbe(
      { command: process.execPath, args: ['-e', 'setTimeout(() => {}, 10000)'], options: { env: {} } },
      200,
    );
    assert.equal(result.ok, false);
  });
});
