// Finding the target at the cursor. The server owns target keys (they are module
// qualified), so the extension asks it for source actions at a position; this module only
// picks the position to ask about and the action to run. Pure: no "vscode".

/** A protocol Command. */
export interface ProtocolCommand {
  title: string;
  command: string;
  arguments?: unknown[];
}

const DECORATOR = /^(\s*)@\s*(?:[A-Za-z_][\w]*\s*\.\s*)*target\b/;
const DEFINITION = /^(\s*)(?:async\s+)?def\s/;

function indentOf(line: string): number {
  return line.length - line.trimStart().length;
}

function isBlankOrComment(line: string): boolean {
  const trimmed = line.trim();
  return trimmed === '' || trimmed.startsWith('#');
}

/**
 * The 0-based line of the `@precompile.target` decorator of the function the cursor is in
 * (on the decorator, between it and the `def`, or in the body); undefined when the cursor
 * is not in a target. The server answers source actions only on decorator..def lines, so
 * a cursor in the body is moved up to the decorator.
 */
export function targetDecoratorLine(text: string, cursorLine: number): number | undefined {
  const lines = text.split(/\r\n|\r|\n/);
  const cursor = Math.min(Math.max(cursorLine, 0), lines.length - 1);
  for (let decorator = cursor; decorator >= 0; decorator--) {
    const match = DECORATOR.exec(lines[decorator]!);
    if (!match) {
      continue;
    }
    const indent = match[1]!.length;
    // The def this decorator belongs to: the first def at the same indent below it.
    let definition = -1;
    for (let line = decorator + 1; line < lines.length; line++) {
      const def = DEFINITION.exec(lines[line]!);
      if (def && def[1]!.length === indent) {
        definition = line;
        break;
      }
      if (/^\s*class\s/.test(lines[line]!) && indentOf(lines[line]!) === indent) {
        break; // a decorated class is not a target
      }
    }
    if (definition < 0) {
      return undefined;
    }
    if (cursor <= definition) {
      return decorator;
    }
    // In the body while every line from the def to the cursor is indented deeper (or blank).
    for (let line = definition + 1; line <= cursor; line++) {
      if (!isBlankOrComment(lines[line]!) && indentOf(lines[line]!) <= indent) {
        return undefined;
      }
    }
    return decorator;
  }
  return undefined;
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
