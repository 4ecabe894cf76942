// Runs the "can this interpreter import the server?" check. Node only (no "vscode").

import { execFile } from 'node:child_process';
import type { Launch } from './serverOptions';

export interface ProbeResult {
  ok: boolean;
  /** The interpreter itself could not be started (ENOENT, EACCES). */
  notFound: boolean;
  /** What it wrote to stderr, or why it failed, for the logs. */
  detail: string;
}

export function runProbe(launch: Launch, timeoutMs = 60_000): Promise<ProbeResult> {
  return new Promise((resolve) => {
    execFile(
      launch.command,
      launch.args,
      { ...launch.options, timeout: timeoutMs, windowsHide: true },
      (error, _stdout, stderr) => {
        if (!error) {
          resolve({ ok: true, notFound: false, detail: '' });
          return;
        }
        const code = (error as NodeJS.ErrnoException).code;
        const notFound = code === 'ENOENT' || code === 'EACCES';
        const detail = String(stderr || '').trim() || error.message;
        resolve({ ok: false, notFound, detail });
      },
    );
  });
}
