// The status bar item's text and tooltip. Pure: no "vscode".

/** Params of the server's `precompile/status` notification. */
export interface StatusParams {
  state: 'idle' | 'capturing';
  findings: number;
  done?: number;
  total?: number;
}

export type ClientState = 'starting' | 'running' | 'stopped' | 'failed';

export interface StatusInputs {
  client: ClientState;
  trusted: boolean;
  enabled: boolean;
  /** The latest `precompile/status`, if the server sent one. */
  status?: StatusParams;
  /** Why the client failed, for the tooltip. */
  error?: string;
}

export interface StatusView {
  text: string;
  tooltip: string;
  /** Background colour: an error for a server that is not running. */
  alert: 'error' | undefined;
}

function plural(count: number, word: string): string {
  return `${count} ${word}${count === 1 ? '' : 's'}`;
}

/** Reads one `precompile/status` notification; undefined when it is not one. */
export function parseStatus(params: unknown): StatusParams | undefined {
  if (typeof params !== 'object' || params === null) {
    return undefined;
  }
  const raw = params as Record<string, unknown>;
  if ((raw.state !== 'idle' && raw.state !== 'capturing') || typeof raw.findings !== 'number') {
    return undefined;
  }
  const status: StatusParams = { state: raw.state, findings: raw.findings };
  if (typeof raw.done === 'number') {
    status.done = raw.done;
  }
  if (typeof raw.total === 'number') {
    status.total = raw.total;
  }
  return status;
}

export function statusView(inputs: StatusInputs): StatusView {
  const logs = 'Click to show the logs.';
  if (inputs.client === 'failed') {
    return {
      text: '$(error) Precompile',
      tooltip: `Precompile: the language server is not running. ${inputs.error ?? ''}`.trim() + `\n${logs}`,
      alert: 'error',
    };
  }
  if (inputs.client === 'stopped') {
    return { text: '$(circle-slash) Precompile', tooltip: `Precompile: the language server is stopped.\n${logs}`, alert: undefined };
  }
  if (inputs.client === 'starting') {
    return { text: '$(sync~spin) Precompile', tooltip: `Precompile: starting the language server.\n${logs}`, alert: undefined };
  }
  if (!inputs.trusted) {
    return {
      text: '$(shield) Precompile: not trusted',
      tooltip:
        'Precompile: this workspace is not trusted, so no target is captured (captures run its code). ' +
        `Trust the workspace to see graph breaks and coverage gaps.\n${logs}`,
      alert: undefined,
    };
  }
  if (!inputs.enabled) {
    return { text: '$(circle-slash) Precompile: off', tooltip: `Precompile: disabled by "precompile.enable".\n${logs}`, alert: undefined };
  }
  const status = inputs.status;
  if (status === undefined) {
    return { text: '$(check) Precompile', tooltip: `Precompile: ready.\n${logs}`, alert: undefined };
  }
  if (status.state === 'capturing') {
    const progress = status.done !== undefined && status.total !== undefined ? ` ${status.done}/${status.total}` : '';
    const detail = progress ? `captured ${status.done} of ${plural(status.total ?? 0, 'target')}` : 'capturing targets';
    return { text: `$(sync~spin) Precompile${progress}`, tooltip: `Precompile: ${detail}.\n${logs}`, alert: undefined };
  }
  if (status.findings > 0) {
    return {
      text: `$(warning) Precompile: ${status.findings}`,
      tooltip: `Precompile: ${plural(status.findings, 'finding')} (see the Problems panel).\n${logs}`,
      alert: undefined,
    };
  }
  return { text: '$(check) Precompile', tooltip: `Precompile: no findings.\n${logs}`, alert: undefined };
}
