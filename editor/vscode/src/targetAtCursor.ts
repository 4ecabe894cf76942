// Finding the target at the cursor. The server owns targets (their keys and where each
// function starts and ends), so the extension asks it for source actions at the cursor;
// this module only picks the action to run. Pure: no "vscode".

/** A protocol Command. */
export interface ProtocolCommand {
  title: string;
  command: string;
  arguments?: unknown[];
}

function asCommand(value: unknown): ProtocolCommand | undefined {
  if (typeof value !== 'object' || value === null) {
    return undefined;
  }
  const raw = value as Record<string, unknown>;
  if (typeof raw.command === 'string') {
    // A bare Command.
    return raw as unknown as ProtocolCommand;
  }
  if (typeof raw.command === 'object' && raw.command !== null) {
    // A CodeAction carrying a Command.
    return asCommand(raw.command);
  }
  return undefined;
}

/** The command of the first action (a CodeAction or a bare Command) that runs `serverCommand`. */
export function pickTargetCommand(actions: unknown, serverCommand: string): ProtocolCommand | undefined {
  if (!Array.isArray(actions)) {
    return undefined;
  }
  for (const action of actions) {
    const command = asCommand(action);
    if (command && command.command === serverCommand) {
      return command;
    }
  }
  return undefined;
}
