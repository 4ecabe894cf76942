import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  initializationOptions,
  installCommand,
  missingServerMessage,
  probeLaunch,
  serverLaunch,
  serverSettings,
} from '../../src/serverOptions';

const venv = { command: '/proj/.venv/bin/python', args: [] };

describe('serverLaunch', () => {
  it('runs <interpreter> -m precompile_lsp with the environment and folder', () => {
    const launch = serverLaunch(venv, { PATH: '/usr/bin', PYTHONPATH: '/proj', UNSET: undefined }, '/proj');
    assert.equal(launch.command, '/proj/.venv/bin/python');
    assert.deepEqual(launch.args, ['-m', 'precompile_lsp']);
    assert.deepEqual(launch.options.env, {
      PATH: '/usr/bin',
      PYTHONPATH: '/proj',
      PYTHONUNBUFFERED: '1',
      PYTHONSAFEPATH: '1',
    });
    assert.equal(launch.options.cwd, '/proj');
  });

  it('keeps an interpreter prefix (conda run ...) before -m', () => {
    const launch = serverLaunch({ command: 'conda', args: ['run', '-n', 'ml', 'python'] }, {});
    assert.equal(launch.command, 'conda');
    assert.deepEqual(launch.args, ['run', '-n', 'ml', 'python', '-m', 'precompile_lsp']);
    assert.equal('cwd' in launch.options, false);
  });

  it('probes with -c "import precompile_lsp"', () => {
    const probe = probeLaunch({ command: 'conda', args: ['run', 'python'] }, { PATH: '/bin' }, '/proj');
    assert.deepEqual(probe.args, ['run', 'python', '-c', 'import precompile_lsp']);
    assert.equal(probe.options.cwd, '/proj');
    assert.equal(probe.options.env.PATH, '/bin');
  });
});

describe('initializationOptions', () => {
  it('says whether the workspace is trusted, only true counting', () => {
    assert.equal(initializationOptions(true, {}).trusted, true);
    assert.equal(initializationOptions(false, {}).trusted, false);
    assert.equal(initializationOptions(1 as unknown as boolean, {}).trusted, false);
  });

  it('passes the settings through', () => {
    const settings = { enable: true, runOnSave: false, timeout: 30, severity: { PC101: 'error' }, codeLens: false };
    assert.deepEqual(initializationOptions(true, settings), { trusted: true, settings });
  });
});

describe('serverSettings', () => {
  it('takes the server keys of the section, leaving out undefined and extension-only ones', () => {
    const section: Record<string, unknown> = {
      enable: false,
      runOnSave: true,
      timeout: null,
      severity: { PC302: 'off' },
      codeLens: undefined,
      docsUrl: 'https://docs.example.org/diagnostics.html',
      interpreter: '/x/python',
      trace: { server: 'verbose' },
    };
    assert.deepEqual(serverSettings((key) => section[key]), {
      enable: false,
      runOnSave: true,
      timeout: null,
      severity: { PC302: 'off' },
      docsUrl: 'https://docs.example.org/diagnostics.html',
    });
  });

  it('passes bad values through for the server to report', () => {
    assert.deepEqual(serverSettings((key) => (key === 'timeout' ? -1 : undefined)), { timeout: -1 });
  });
});

describe('missing server message', () => {
  it('names the interpreter and the pip command', () => {
    const message = missingServerMessage(venv, false);
    assert.match(message, /"\/proj\/\.venv\/bin\/python" cannot import precompile_lsp/);
    assert.ok(message.includes('`/proj/.venv/bin/python -m pip install torch-precompile`'));
    assert.equal(installCommand({ command: 'py', args: ['-3.12'] }), 'py -3.12 -m pip install torch-precompile');
  });

  it('says when the interpreter does not exist', () => {
    assert.match(missingServerMessage({ command: 'python3', args: [] }, true), /"python3" was not found/);
  });
});
