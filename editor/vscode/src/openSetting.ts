// Which command opens the Settings editor at one setting. Pure: no "vscode".
//
// A machine-overridable setting such as precompile.interpreter is set per machine. In a
// remote window (Remote-SSH, WSL, a container, code-server) the Settings editor's User
// tab hides it ("No Settings Found") and only the Remote tab shows it, so the fix we
// offer must open that tab there.

export interface SettingsCommand {
  command: string;
  args: unknown[];
}

export function openSettingCommand(setting: string, remoteName: string | undefined): SettingsCommand {
  if (remoteName) {
    return { command: 'workbench.action.openRemoteSettings', args: [{ query: setting }] };
  }
  return { command: 'workbench.action.openSettings', args: [setting] };
}
