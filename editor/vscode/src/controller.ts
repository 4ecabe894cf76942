// Owns the language client: resolves the interpreter, checks it can run the server,
// starts, stops and restarts the client one at a time, and keeps the status bar current.

import * as os from 'node:os';
import * as vscode from 'vscode';
import {
  LanguageClient,
  type LanguageClientOptions,
  RevealOutputChannelOn,
  type ServerOptions,
  State,
  TransportKind,
} from 'vscode-languageclient/node';
import { clientOutput, type ClientOutput } from './clientOutput';
import { displayInterpreter, resolveInterpreter, type Interpreter } from './interpreter';
import { openSettingCommand } from './openSetting';
import { runProbe } from './probe';
import { onInterpreterChange, pythonExtensionApi, pythonExtensionInstalled } from './pythonExtension';
import {
  initializationOptions,
  missingServerMessage,
  probeLaunch,
  serverLaunch,
  serverSettings,
} from './serverOptions';
import { parseStatus, statusView, type ClientState, type StatusParams } from './status';

export const CLIENT_ID = 'precompile';
export const CLIENT_NAME = 'Precompile';
const STATUS_NOTIFICATION = 'precompile/status';

export class ServerController implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private clientOutput: ClientOutput | undefined;
  private interpreter: Interpreter | undefined;
  private queue: Promise<void> = Promise.resolve();
  private state: ClientState = 'stopped';
  private status: StatusParams | undefined;
  private error: string | undefined;
  private interpreterWatch: vscode.Disposable | undefined;
  private disposed = false;

  constructor(
    private readonly output: vscode.LogOutputChannel,
    private readonly traceOutput: vscode.OutputChannel,
    private readonly item: vscode.StatusBarItem,
  ) {
    this.render();
  }

  /** The client, when it is running. */
  get running(): LanguageClient | undefined {
    return this.client?.state === State.Running ? this.client : undefined;
  }

  start(): Promise<void> {
    return this.enqueue(() => this.startNow());
  }

  restart(): Promise<void> {
    return this.enqueue(async () => {
      await this.stopNow();
      await this.startNow();
    });
  }

  stop(): Promise<void> {
    return this.enqueue(() => this.stopNow());
  }

  render(): void {
    const view = statusView({
      client: this.state,
      trusted: vscode.workspace.isTrusted,
      enabled: vscode.workspace.getConfiguration('precompile').get<boolean>('enable', true),
      status: this.status,
      error: this.error,
    });
    this.item.text = view.text;
    this.item.tooltip = view.tooltip;
    this.item.backgroundColor = view.alert ? new vscode.ThemeColor('statusBarItem.errorBackground') : undefined;
    this.item.show();
  }

  async dispose(): Promise<void> {
    this.disposed = true;
    this.interpreterWatch?.dispose();
    await this.stop();
  }

  private enqueue(step: () => Promise<void>): Promise<void> {
    const next = this.queue.then(step, step);
    this.queue = next.catch((error: unknown) => this.output.error(`Precompile: ${String(error)}`));
    return this.queue;
  }

  private setState(state: ClientState, error?: string): void {
    this.state = state;
    this.error = error;
    if (state !== 'running') {
      this.status = undefined;
    }
    this.render();
  }

  private folder(): vscode.WorkspaceFolder | undefined {
    const active = vscode.window.activeTextEditor?.document.uri;
    return (active && vscode.workspace.getWorkspaceFolder(active)) ?? vscode.workspace.workspaceFolders?.[0];
  }

  private async resolve(): Promise<Interpreter> {
    const folder = this.folder();
    const setting = vscode.workspace.getConfiguration('precompile', folder?.uri).inspect<string>('interpreter');
    return resolveInterpreter({
      setting,
      trusted: vscode.workspace.isTrusted,
      pythonApi: async () => {
        const api = await pythonExtensionApi();
        if (api && !this.interpreterWatch) {
          this.interpreterWatch = onInterpreterChange(api, () => void this.onPythonInterpreterChanged());
        }
        return api;
      },
      resource: folder?.uri,
      platform: process.platform,
      workspaceFolder: folder?.uri.fsPath,
      home: os.homedir(),
      log: (message) => this.output.warn(message),
    });
  }

  private async onPythonInterpreterChanged(): Promise<void> {
    if (this.disposed) {
      return;
    }
    const next = await this.resolve();
    const current = this.interpreter;
    if (!current || displayInterpreter(next) !== displayInterpreter(current)) {
      this.output.info(`The selected Python interpreter changed to ${displayInterpreter(next)}; restarting`);
      await this.restart();
    }
  }

  private async startNow(): Promise<void> {
    if (this.disposed) {
      return;
    }
    this.setState('starting');
    try {
      await this.launch();
    } catch (error) {
      const message = `Precompile: the language server failed to start: ${String(error)}`;
      this.output.error(message);
      this.setState('failed', message);
    }
  }

  private async launch(): Promise<void> {
    const interpreter = await this.resolve();
    this.interpreter = interpreter;
    const shown = displayInterpreter(interpreter);
    const cwd = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
    this.output.info(`Using ${shown} (from ${interpreter.source})`);

    const probe = await runProbe(probeLaunch(interpreter, process.env, cwd));
    if (!probe.ok) {
      const message = missingServerMessage(interpreter, probe.notFound);
      this.output.error(`${message}\n${probe.detail}`);
      this.setState('failed', message);
      void this.offerFix(message);
      return;
    }

    const launch = serverLaunch(interpreter, process.env, cwd);
    const serverOptions: ServerOptions = {
      command: launch.command,
      args: launch.args,
      options: launch.options,
      transport: TransportKind.stdio,
    };
    const output = clientOutput(this.output);
    const clientOptions: LanguageClientOptions = {
      documentSelector: [{ scheme: 'file', language: 'python' }],
      // Computed when the client initializes, so a restart after trust is granted says so.
      initializationOptions: () =>
        initializationOptions(
          vscode.workspace.isTrusted,
          serverSettings((key) => vscode.workspace.getConfiguration('precompile').get(key)),
        ),
      synchronize: { configurationSection: 'precompile' },
      outputChannel: output.channel,
      traceOutputChannel: this.traceOutput,
      revealOutputChannelOn: RevealOutputChannelOn.Never,
      diagnosticCollectionName: 'precompile',
    };
    const client = new LanguageClient(CLIENT_ID, CLIENT_NAME, serverOptions, clientOptions);
    client.onDidChangeState((event) => {
      if (client !== this.client) {
        return;
      }
      if (event.newState === State.Running) {
        this.setState('running');
      } else if (event.newState === State.Stopped && this.state === 'running') {
        this.setState('stopped');
      }
    });
    client.onNotification(STATUS_NOTIFICATION, (params: unknown) => {
      const status = parseStatus(params);
      if (status && client === this.client) {
        this.status = status;
        this.render();
      }
    });
    this.client = client;
    this.clientOutput = output;
    await client.start();
    this.setState('running');
  }

  private async stopNow(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    this.clientOutput?.stopRequested();
    this.clientOutput = undefined;
    if (client) {
      try {
        // Stops the server (shutdown, exit; killed after the timeout) and frees the client.
        await client.dispose(5_000);
      } catch (error) {
        this.output.warn(`Stopping the language server: ${String(error)}`);
      }
    }
    this.setState('stopped');
  }

  private async offerFix(message: string): Promise<void> {
    const select = 'Select Interpreter';
    const setting = 'Open Setting';
    const logs = 'Show Logs';
    const buttons = pythonExtensionInstalled() ? [select, setting, logs] : [setting, logs];
    const choice = await vscode.window.showErrorMessage(message, ...buttons);
    if (choice === select) {
      await vscode.commands.executeCommand('python.setInterpreter');
    } else if (choice === setting) {
      const open = openSettingCommand('precompile.interpreter', vscode.env.remoteName);
      await vscode.commands.executeCommand(open.command, ...open.args);
    } else if (choice === logs) {
      this.output.show();
    }
  }
}
