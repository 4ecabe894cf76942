import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type * as vscode from 'vscode';
import { clientOutput, isRequestedExit } from '../../src/clientOutput';

/** Just enough of a LogOutputChannel to see what reaches it. */
function fakeChannel(): { channel: vscode.LogOutputChannel; lines: string[] } {
  const lines: string[] = [];
  const channel = {
    name: 'Precompile',
    appendLine: (line: string) => lines.push(line),
    append: (text: string) => lines.push(text),
    error: (message: string) => lines.push(`error: ${message}`),
  } as unknown as vscode.LogOutputChannel;
  return { channel, lines };
}

const EXIT_0 = '[Error - 10:00:00 AM] Server process exited with code 0.';

describe('isRequestedExit', () => {
  it('is the clean exit line, only once a stop was requested', () => {
    assert.equal(isRequestedExit(EXIT_0, true), true);
    assert.equal(isRequestedExit(EXIT_0, false), false);
    assert.equal(isRequestedExit('[Error - 10:00:00 AM] Server process exited with code 1.', true), false);
    assert.equal(isRequestedExit('[Error - 10:00:00 AM] Server process exited with signal SIGKILL.', true), false);
  });
});

describe('clientOutput', () => {
  it('passes everything through until a stop is requested', () => {
    const { channel, lines } = fakeChannel();
    const output = clientOutput(channel);
    output.channel.appendLine('[Info] starting');
    output.channel.appendLine(EXIT_0);
    output.channel.error('boom');
    assert.deepEqual(lines, ['[Info] starting', EXIT_0, 'error: boom']);
    assert.equal(output.channel.name, 'Precompile');
  });

  it('drops only the clean exit line after a stop is requested', () => {
    const { channel, lines } = fakeChannel();
    const output = clientOutput(channel);
    output.stopRequested();
    output.channel.appendLine(EXIT_0);
    output.channel.appendLine('[Error - 10:00:01 AM] Server process exited with code 1.');
    output.channel.append('stderr text');
    assert.deepEqual(lines, ['[Error - 10:00:01 AM] Server process exited with code 1.', 'stderr text']);
  });
});
