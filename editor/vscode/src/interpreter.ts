// Which Python runs the language server. Pure: every lookup is injected, so this module
// never imports "vscode" and node --test can load it.

/** A command line prefix that starts Python: `command ...args -m precompile_lsp`. */
export interface Interpreter {
  command: string;
  args: string[];
  /** Where it came from, for the logs and the error message. */
  source: 'setting' | 'python-extension' | 'default';
}

/** The scopes of the `precompile.interpreter` setting (as WorkspaceConfiguration.inspect gives them). */
export interface SettingValues {
  globalValue?: unknown;
  workspaceValue?: unknown;
  workspaceFolderValue?: unknown;
}

/** The part of the ms-python.python extension's exports this module uses; every field may be absent. */
export interface PythonExtensionApi {
  environments?: {
    getActiveEnvironmentPath?(resource?: unknown): { id?: string; path?: string } | undefined;
    resolveEnvironment?(
      environment: unknown,
    ): Promise<{ executable?: { uri?: { fsPath?: string } } } | undefined> | undefined;
  };
  settings?: {
    getExecutionDetails?(resource?: unknown): { execCommand?: string[] | undefined } | undefined;
  };
}

export interface ResolveInputs {
  setting: SettingValues | undefined;
  /** In an untrusted workspace only the user's (global) value counts. */
  trusted: boolean;
  /** The Python extension's exports, or undefined when it is not installed. */
  pythonApi: () => Promise<PythonExtensionApi | undefined>;
  /** Passed to the Python extension to pick the folder's environment (a vscode.Uri). */
  resource?: unknown;
  platform: string;
  workspaceFolder?: string;
  home?: string;
  /** Where failures of the Python extension are reported; they never stop resolution. */
  log?: (message: string) => void;
}

function nonEmpty(value: unknown): string | undefined {
  return typeof value === 'string' && value.trim() !== '' ? value.trim() : undefined;
}

/** The effective setting: folder over workspace over user, workspace scopes only when trusted. */
export function settingValue(values: SettingValues | undefined, trusted: boolean): string | undefined {
  if (!values) {
    return undefined;
  }
  const scoped = trusted ? [values.workspaceFolderValue, values.workspaceValue] : [];
  for (const value of [...scoped, values.globalValue]) {
    const found = nonEmpty(value);
    if (found !== undefined) {
      return found;
    }
  }
  return undefined;
}

/** `${workspaceFolder}` and a leading `~` in a configured path. */
export function expandPath(value: string, workspaceFolder?: string, home?: string): string {
  let result = value;
  if (workspaceFolder !== undefined) {
    result = result.split('${workspaceFolder}').join(workspaceFolder);
  }
  if (home !== undefined && (result === '~' || result.startsWith('~/') || result.startsWith('~\\'))) {
    result = home + result.slice(1);
  }
  return result;
}

export function defaultPython(platform: string): string {
  return platform === 'win32' ? 'python' : 'python3';
}

/** The Python extension's interpreter: the new environments API, else the older execution details. */
export async function fromPythonExtension(
  api: PythonExtensionApi,
  resource: unknown,
  log: (message: string) => void = () => undefined,
): Promise<string[] | undefined> {
  const environments = api.environments;
  if (environments?.getActiveEnvironmentPath && environments.resolveEnvironment) {
    try {
      const active = environments.getActiveEnvironmentPath(resource);
      if (active) {
        const resolved = await environments.resolveEnvironment(active);
        const executable = nonEmpty(resolved?.executable?.uri?.fsPath);
        if (executable !== undefined) {
          return [executable];
        }
      }
    } catch (error) {
      log(`the Python extension's environments API failed: ${String(error)}`);
    }
  }
  if (api.settings?.getExecutionDetails) {
    try {
      const command = api.settings.getExecutionDetails(resource)?.execCommand;
      if (Array.isArray(command) && nonEmpty(command[0]) !== undefined) {
        return command.filter((part) => typeof part === 'string' && part !== '');
      }
    } catch (error) {
      log(`the Python extension's execution details failed: ${String(error)}`);
    }
  }
  return undefined;
}

/** `precompile.interpreter`, else the Python extension's selection, else python3 / python. */
export async function resolveInterpreter(inputs: ResolveInputs): Promise<Interpreter> {
  const log = inputs.log ?? (() => undefined);
  const configured = settingValue(inputs.setting, inputs.trusted);
  if (configured !== undefined) {
    return {
      command: expandPath(configured, inputs.workspaceFolder, inputs.home),
      args: [],
      source: 'setting',
    };
  }
  let api: PythonExtensionApi | undefined;
  try {
    api = await inputs.pythonApi();
  } catch (error) {
    log(`the Python extension could not be activated: ${String(error)}`);
  }
  if (api) {
    const command = await fromPythonExtension(api, inputs.resource, log);
    if (command && command.length > 0) {
      return { command: command[0]!, args: command.slice(1), source: 'python-extension' };
    }
  }
  return { command: defaultPython(inputs.platform), args: [], source: 'default' };
}

/** The interpreter as one would type it in a terminal (quoted where it has spaces). */
export function displayInterpreter(interpreter: Pick<Interpreter, 'command' | 'args'>): string {
  return [interpreter.command, ...interpreter.args]
    .map((part) => (/\s/.test(part) ? `"${part}"` : part))
    .join(' ');
}
