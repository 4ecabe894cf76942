import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  displayInterpreter,
  expandPath,
  resolveInterpreter,
  settingValue,
  type PythonExtensionApi,
  type ResolveInputs,
} from '../../src/interpreter';

const NO_PYTHON_EXTENSION = async (): Promise<PythonExtensionApi | undefined> => undefined;

function inputs(overrides: Partial<ResolveInputs> = {}): ResolveInputs {
  return { setting: undefined, trusted: true, pythonApi: NO_PYTHON_EXTENSION, platform: 'linux', ...overrides };
}

/** An environments API whose active environment resolves to `executable`. */
function environmentsApi(executable: string | undefined, seen: unknown[] = []): PythonExtensionApi {
  return {
    environments: {
      getActiveEnvironmentPath(resource) {
        seen.push(resource);
        return { id: 'env', path: '/envs/env' };
      },
      async resolveEnvironment(environment) {
        assert.deepEqual(environment, { id: 'env', path: '/envs/env' });
        return executable === undefined ? undefined : { executable: { uri: { fsPath: executable } } };
      },
    },
  };
}

describe('resolveInterpreter', () => {
  it('uses the setting first, without asking the Python extension', async () => {
    let asked = false;
    const result = await resolveInterpreter(
      inputs({
        setting: { globalValue: '/opt/py/bin/python' },
        pythonApi: async () => {
          asked = true;
          return environmentsApi('/other/python');
        },
      }),
    );
    assert.deepEqual(result, { command: '/opt/py/bin/python', args: [], source: 'setting' });
    assert.equal(asked, false);
  });

  it('prefers the folder value over the workspace value over the user value', async () => {
    const setting = { globalValue: '/user/python', workspaceValue: '/ws/python', workspaceFolderValue: '/folder/python' };
    assert.equal((await resolveInterpreter(inputs({ setting }))).command, '/folder/python');
    assert.equal(
      (await resolveInterpreter(inputs({ setting: { globalValue: '/user/python', workspaceValue: '/ws/python' } }))).command,
      '/ws/python',
    );
  });

  it('ignores workspace values in an untrusted workspace', async () => {
    const setting = { globalValue: '/user/python', workspaceValue: '/evil/python', workspaceFolderValue: '/evil2/python' };
    assert.equal((await resolveInterpreter(inputs({ setting, trusted: false }))).command, '/user/python');
    const onlyWorkspace = await resolveInterpreter(inputs({ setting: { workspaceValue: '/evil/python' }, trusted: false }));
    assert.deepEqual(onlyWorkspace, { command: 'python3', args: [], source: 'default' });
  });

  it('ignores an empty or whitespace setting and trims a set one', async () => {
    for (const value of ['', '   ', '\t\n', undefined, null, 42]) {
      const result = await resolveInterpreter(inputs({ setting: { globalValue: value } }));
      assert.equal(result.source, 'default', `value ${JSON.stringify(value)}`);
    }
    const trimmed = await resolveInterpreter(inputs({ setting: { globalValue: '  /opt/python  ' } }));
    assert.equal(trimmed.command, '/opt/python');
  });

  it('expands ${workspaceFolder} and ~ in the setting', async () => {
    const result = await resolveInterpreter(
      inputs({ setting: { workspaceValue: '${workspaceFolder}/.venv/bin/python' }, workspaceFolder: '/proj' }),
    );
    assert.equal(result.command, '/proj/.venv/bin/python');
    assert.equal(expandPath('~/venv/bin/python', undefined, '/home/me'), '/home/me/venv/bin/python');
    assert.equal(expandPath('/a/~b', undefined, '/home/me'), '/a/~b');
  });

  it("uses the Python extension's environments API, passing the resource", async () => {
    const seen: unknown[] = [];
    const result = await resolveInterpreter(
      inputs({ pythonApi: async () => environmentsApi('/envs/env/bin/python', seen), resource: 'folder-uri' }),
    );
    assert.deepEqual(result, { command: '/envs/env/bin/python', args: [], source: 'python-extension' });
    assert.deepEqual(seen, ['folder-uri']);
  });

  it('falls back to the older execution details API', async () => {
    const api: PythonExtensionApi = {
      settings: { getExecutionDetails: () => ({ execCommand: ['conda', 'run', '-n', 'ml', 'python'] }) },
    };
    const result = await resolveInterpreter(inputs({ pythonApi: async () => api }));
    assert.deepEqual(result, { command: 'conda', args: ['run', '-n', 'ml', 'python'], source: 'python-extension' });
  });

  it('falls back to execution details when the environments API resolves nothing', async () => {
    const api: PythonExtensionApi = {
      ...environmentsApi(undefined),
      settings: { getExecutionDetails: () => ({ execCommand: ['/old/python'] }) },
    };
    assert.equal((await resolveInterpreter(inputs({ pythonApi: async () => api }))).command, '/old/python');
  });

  it('survives a Python extension that throws or has no usable API', async () => {
    const logged: string[] = [];
    const throwing: PythonExtensionApi = {
      environments: {
        getActiveEnvironmentPath() {
          throw new Error('boom');
        },
        resolveEnvironment: async () => undefined,
      },
      settings: {
        getExecutionDetails() {
          throw new Error('bang');
        },
      },
    };
    const cases: Array<() => Promise<PythonExtensionApi | undefined>> = [
      async () => throwing,
      async () => ({}),
      async () => ({ settings: { getExecutionDetails: () => ({ execCommand: undefined }) } }),
      async () => {
        throw new Error('activation failed');
      },
    ];
    for (const pythonApi of cases) {
      const result = await resolveInterpreter(inputs({ pythonApi, log: (m) => logged.push(m) }));
      assert.deepEqual(result, { command: 'python3', args: [], source: 'default' });
    }
    assert.ok(logged.some((m) => m.includes('boom')));
    assert.ok(logged.some((m) => m.includes('bang')));
    assert.ok(logged.some((m) => m.includes('activation failed')));
  });

  it('defaults to python3, or python on Windows', async () => {
    assert.deepEqual(await resolveInterpreter(inputs()), { command: 'python3', args: [], source: 'default' });
    assert.equal((await resolveInterpreter(inputs({ platform: 'win32' }))).command, 'python');
    assert.equal((await resolveInterpreter(inputs({ platform: 'darwin' }))).command, 'python3');
  });
});

describe('settingValue and displayInterpreter', () => {
  it('handles an absent inspection', () => {
    assert.equal(settingValue(undefined, true), undefined);
  });

  it('quotes parts with spaces', () => {
    assert.equal(
      displayInterpreter({ command: 'C:\\Program Files\\Python\\python.exe', args: ['-X', 'utf8'] }),
      '"C:\\Program Files\\Python\\python.exe" -X utf8',
    );
  });
});
