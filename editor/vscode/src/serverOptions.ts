// How the language server is started and what it is told at initialize. Pure: no "vscode".

import { displayInterpreter, type Interpreter } from './interpreter';

export const SERVER_MODULE = 'precompile_lsp';

/** The keys of the `precompile` section the server reads (camelCase, as on the wire). */
export const SERVER_SETTING_KEYS = ['enable', 'runOnSave', 'timeout', 'severity', 'codeLens', 'docsUrl', 'servingLogs'] as const;

export interface ServerSettings {
  enable?: boolean;
  runOnSave?: boolean;
  timeout?: number | null;
  severity?: Record<string, string>;
  codeLens?: boolean;
  docsUrl?: string;
  servingLogs?: string[];
}

export interface InitializationOptions {
  trusted: boolean;
  settings: ServerSettings;
}

export interface Launch {
  command: string;
  args: string[];
  options: { env: Record<string, string>; cwd?: string };
}

/** The server's settings out of the `precompile` section; values are passed through
 * unchanged (the server validates and reports bad ones), undefined ones are left out. */
export function serverSettings(get: (key: string) => unknown): ServerSettings {
  const settings: Record<string, unknown> = {};
  for (const key of SERVER_SETTING_KEYS) {
    const value = get(key);
    if (value !== undefined) {
      settings[key] = value;
    }
  }
  return settings as ServerSettings;
}

export function initializationOptions(trusted: boolean, settings: ServerSettings): InitializationOptions {
  // Anything but a literal true is untrusted: captures run the workspace's code.
  return { trusted: trusted === true, settings };
}

function plainEnv(env: Record<string, string | undefined>): Record<string, string> {
  const result: Record<string, string> = {};
  for (const [key, value] of Object.entries(env)) {
    if (value !== undefined) {
      result[key] = value;
    }
  }
  return result;
}

/** `<interpreter> -m precompile_lsp`, over stdio, in the first workspace folder. */
export function serverLaunch(
  interpreter: Pick<Interpreter, 'command' | 'args'>,
  env: Record<string, string | undefined>,
  cwd?: string,
): Launch {
  const options: Launch['options'] = {
    // Unbuffered stderr, so the server's log reaches the output channel as it is written.
    // Safe path: `-m` would put the folder (cwd) first on sys.path, and a workspace file
    // named like a module the server imports would run, trusted or not.
    env: { ...plainEnv(env), PYTHONUNBUFFERED: '1', PYTHONSAFEPATH: '1' },
  };
  if (cwd !== undefined) {
    options.cwd = cwd;
  }
  return { command: interpreter.command, args: [...interpreter.args, '-m', SERVER_MODULE], options };
}

/** The check run before starting: can this interpreter import the server? */
export function probeLaunch(
  interpreter: Pick<Interpreter, 'command' | 'args'>,
  env: Record<string, string | undefined>,
  cwd?: string,
): Launch {
  const launch = serverLaunch(interpreter, env, cwd);
  return { ...launch, args: [...interpreter.args, '-c', `import ${SERVER_MODULE}`] };
}

/** What to run to fix a missing server. */
export function installCommand(interpreter: Pick<Interpreter, 'command' | 'args'>): string {
  return `${displayInterpreter(interpreter)} -m pip install torch-precompile`;
}

/** The one error shown when the interpreter cannot import the server. */
export function missingServerMessage(interpreter: Pick<Interpreter, 'command' | 'args'>, notFound: boolean): string {
  const shown = displayInterpreter(interpreter);
  const problem = notFound ? `the Python interpreter "${shown}" was not found` : `"${shown}" cannot import ${SERVER_MODULE}`;
  return (
    `Precompile: the language server cannot start: ${problem}. ` +
    `Install it with \`${installCommand(interpreter)}\`, or pick another interpreter ` +
    '(the "precompile.interpreter" setting or the Python extension\'s selection).'
  );
}
