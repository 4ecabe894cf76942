// The channel one language client writes to: the user's "Precompile" channel, less the
// "Server process exited with code 0." line vscode-languageclient writes (as an error)
// whenever its server process ends, even when we asked it to stop: a restart after trust
// is granted, or a changed interpreter, is not an error. Pure: "vscode" only as types.

import type * as vscode from 'vscode';

const CLEAN_EXIT = /\] Server process exited with code 0\.\s*$/;

/** Whether a line the client writes reports the clean exit of a server asked to stop. */
export function isRequestedExit(line: string, stopRequested: boolean): boolean {
  return stopRequested && CLEAN_EXIT.test(line);
}

export interface ClientOutput {
  /** Give this to the client as its `outputChannel`. */
  readonly channel: vscode.LogOutputChannel;
  /** Call before stopping the client: its server's clean exit is expected from now on. */
  stopRequested(): void;
}

/** A view of `output` for one client; everything but the expected exit line goes through. */
export function clientOutput(output: vscode.LogOutputChannel): ClientOutput {
  let stopping = false;
  const appendLine = (line: string): void => {
    if (!isRequestedExit(line, stopping)) {
      output.appendLine(line);
    }
  };
  const channel = new Proxy(output, {
    get(target, property) {
      if (property === 'appendLine') {
        return appendLine;
      }
      const value: unknown = Reflect.get(target, property, target);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
  return {
    channel,
    stopRequested: () => {
      stopping = true;
    },
  };
}
