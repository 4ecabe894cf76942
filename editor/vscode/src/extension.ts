// Activation: wires the output channels, the status bar item, the commands and the
// events that restart the server to the controller that owns the language client.

import * as vscode from 'vscode';
import { registerCommands } from './commands';
import { ServerController } from './controller';

let controller: ServerController | undefined;

export function activate(context: vscode.ExtensionContext): void {
  const output = vscode.window.createOutputChannel('Precompile', { log: true });
  // vscode-languageclient writes the trace here at the level of `precompile.trace.server`.
  const traceOutput = vscode.window.createOutputChannel('Precompile Trace');
  const item = vscode.window.createStatusBarItem('precompile.status', vscode.StatusBarAlignment.Left, 0);
  item.name = 'Precompile';
  item.command = 'precompile.showLogs';
  controller = new ServerController(output, traceOutput, item);
  const owned = controller;

  context.subscriptions.push(
    output,
    traceOutput,
    item,
    { dispose: () => void owned.dispose() },
    ...registerCommands(owned, output),
    // Granting trust is the only way the server learns it may run captures: restart it.
    vscode.workspace.onDidGrantWorkspaceTrust(() => {
      output.info('The workspace is now trusted; restarting the language server');
      void owned.restart();
    }),
    vscode.workspace.onDidChangeConfiguration((event) => {
      if (event.affectsConfiguration('precompile.interpreter')) {
        output.info('precompile.interpreter changed; restarting the language server');
        void owned.restart();
      } else if (event.affectsConfiguration('precompile.enable')) {
        owned.render();
      }
    }),
  );
  void owned.start();
}

export async function deactivate(): Promise<void> {
  const current = controller;
  controller = undefined;
  await current?.dispose();
}
