// The ms-python.python extension, when it is installed: its exports and its
// "interpreter changed" events. Absent or failing, everything here answers undefined.

import * as vscode from 'vscode';
import type { PythonExtensionApi } from './interpreter';

export const PYTHON_EXTENSION_ID = 'ms-python.python';

interface Events {
  environments?: { onDidChangeActiveEnvironmentPath?: vscode.Event<unknown> };
  settings?: { onDidChangeExecutionDetails?: vscode.Event<unknown> };
}

export function pythonExtensionInstalled(): boolean {
  return vscode.extensions.getExtension(PYTHON_EXTENSION_ID) !== undefined;
}

export async function pythonExtensionApi(): Promise<PythonExtensionApi | undefined> {
  const extension = vscode.extensions.getExtension(PYTHON_EXTENSION_ID);
  if (!extension) {
    return undefined;
  }
  if (!extension.isActive) {
    await extension.activate();
  }
  const exports: unknown = extension.exports;
  return typeof exports === 'object' && exports !== null ? (exports as PythonExtensionApi) : undefined;
}

/** Calls `listener` when the selected interpreter changes; undefined when it cannot tell. */
export function onInterpreterChange(api: PythonExtensionApi, listener: () => void): vscode.Disposable | undefined {
  const events = api as Events;
  const event = events.environments?.onDidChangeActiveEnvironmentPath ?? events.settings?.onDidChangeExecutionDetails;
  return typeof event === 'function' ? event(() => listener()) : undefined;
}
