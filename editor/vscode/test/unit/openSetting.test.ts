import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { openSettingCommand } from '../../src/openSetting';

describe('openSettingCommand', () => {
  it('opens the user settings at the setting in a local window', () => {
    assert.deepEqual(openSettingCommand('precompile.interpreter', undefined), {
      command: 'workbench.action.openSettings',
      args: ['precompile.interpreter'],
    });
  });

  it('opens the remote settings, where machine settings are shown, in a remote window', () => {
    assert.deepEqual(openSettingCommand('precompile.interpreter', 'ssh-remote'), {
      command: 'workbench.action.openRemoteSettings',
      args: [{ query: 'precompile.interpreter' }],
    });
  });
});
