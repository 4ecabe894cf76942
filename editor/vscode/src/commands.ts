// The client-side commands. Their ids differ from the server's (precompile.emit,
// precompile.verify, precompile.recheck), which vscode-languageclient registers itself.

import * as vscode from 'vscode';
import {
  CodeActionRequest,
  ExecuteCommandRequest,
  type LanguageClient,
} from 'vscode-languageclient/node';
import type { ServerController } from './controller';
import { pickTargetCommand, type ProtocolCommand } from './targetAtCursor';

export const SERVER_EMIT = 'precompile.emit';
export const SERVER_VERIFY = 'precompile.verify';
export const SERVER_RECHECK = 'precompile.recheck';

export function registerCommands(
  controller: ServerController,
  output: vscode.LogOutputChannel,
): vscode.Disposable[] {
  return [
    vscode.commands.registerCommand('precompile.emitArtifact', () => runAtCursor(controller, SERVER_EMIT)),
    vscode.commands.registerCommand('precompile.verifyArtifact', () => runAtCursor(controller, SERVER_VERIFY)),
    vscode.commands.registerCommand('precompile.recheckWorkspace', () => recheck(controller)),
    vscode.commands.registerCommand('precompile.restartServer', () => controller.restart()),
    vscode.commands.registerCommand('precompile.showLogs', () => output.show()),
  ];
}

/** The running client, or undefined after telling the user why there is none. */
function clientOrExplain(controller: ServerController): LanguageClient | undefined {
  const client = controller.running;
  if (!client) {
    void vscode.window
      .showErrorMessage('Precompile: the language server is not running.', 'Restart Server', 'Show Logs')
      .then((choice) => {
        if (choice === 'Restart Server') {
          void vscode.commands.executeCommand('precompile.restartServer');
        } else if (choice === 'Show Logs') {
          void vscode.commands.executeCommand('precompile.showLogs');
        }
      });
  }
  return client;
}

/** Emit and verify run the workspace's code: refuse, and say how to change that, when untrusted. */
function trustedOrExplain(): boolean {
  if (!vscode.workspace.isTrusted) {
    void vscode.window
      .showWarningMessage(
        'Precompile: this workspace is not trusted, and emitting or verifying runs its code.',
        'Manage Workspace Trust',
      )
      .then((choice) => {
        if (choice) {
          void vscode.commands.executeCommand('workbench.trust.manage');
        }
      });
  }
  return vscode.workspace.isTrusted;
}

async function sourceActions(
  client: LanguageClient,
  document: vscode.TextDocument,
  range: vscode.Range,
): Promise<unknown> {
  // Target-level findings carry data.target, which lets the server find the target from
  // anywhere in its span.
  const diagnostics = vscode.languages
    .getDiagnostics(document.uri)
    .filter((d) => d.source === 'precompile' && d.range.intersection(range) !== undefined);
  return client.sendRequest(CodeActionRequest.type, {
    textDocument: client.code2ProtocolConverter.asTextDocumentIdentifier(document),
    range: client.code2ProtocolConverter.asRange(range),
    context: {
      diagnostics: await client.code2ProtocolConverter.asDiagnostics(diagnostics),
      only: ['source'],
    },
  });
}

async function targetCommand(
  client: LanguageClient,
  editor: vscode.TextEditor,
  serverCommand: string,
): Promise<ProtocolCommand | undefined> {
  // The server knows where each target is (decorator to last line): it answers source
  // actions anywhere in one.
  return pickTargetCommand(await sourceActions(client, editor.document, editor.selection), serverCommand);
}

async function runAtCursor(controller: ServerController, serverCommand: string): Promise<void> {
  const editor = vscode.window.activeTextEditor;
  if (!editor || editor.document.languageId !== 'python' || editor.document.uri.scheme !== 'file') {
    void vscode.window.showInformationMessage('Precompile: put the cursor in a precompile target of a Python file.');
    return;
  }
  if (!trustedOrExplain()) {
    return;
  }
  const client = clientOrExplain(controller);
  if (!client) {
    return;
  }
  const command = await targetCommand(client, editor, serverCommand);
  if (!command) {
    void vscode.window.showInformationMessage('No precompile target at the cursor');
    return;
  }
  // The server reports progress and shows the outcome itself.
  try {
    await client.sendRequest(ExecuteCommandRequest.type, {
      command: command.command,
      arguments: command.arguments ?? [],
    });
  } catch (error) {
    void vscode.window.showErrorMessage(`Precompile: ${command.title} failed: ${errorMessage(error)}`);
  }
}

function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

async function recheck(controller: ServerController): Promise<void> {
  if (!trustedOrExplain()) {
    return;
  }
  const client = clientOrExplain(controller);
  if (!client) {
    return;
  }
  let result: unknown;
  try {
    result = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Window, title: 'Precompile: rechecking the workspace' },
      () => client.sendRequest(ExecuteCommandRequest.type, { command: SERVER_RECHECK, arguments: [] }),
    );
  } catch (error) {
    void vscode.window.showErrorMessage(`Precompile: the recheck failed: ${errorMessage(error)}`);
    return;
  }
  if (typeof result === 'string' && result !== '') {
    void vscode.window.showInformationMessage(result);
  }
}
