import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseStatus, statusView, type StatusInputs } from '../../src/status';

function view(overrides: Partial<StatusInputs>) {
  return statusView({ client: 'running', trusted: true, enabled: true, ...overrides });
}

describe('statusView', () => {
  it('spins with progress while capturing', () => {
    const shown = view({ status: { state: 'capturing', findings: 0, done: 2, total: 5 } });
    assert.equal(shown.text, '$(sync~spin) Precompile 2/5');
    assert.match(shown.tooltip, /captured 2 of 5 targets/);
    assert.equal(view({ status: { state: 'capturing', findings: 3 } }).text, '$(sync~spin) Precompile');
  });

  it('shows a check when idle without findings, a count with', () => {
    assert.equal(view({ status: { state: 'idle', findings: 0 } }).text, '$(check) Precompile');
    const three = view({ status: { state: 'idle', findings: 3 } });
    assert.equal(three.text, '$(warning) Precompile: 3');
    assert.match(three.tooltip, /3 findings/);
    assert.match(view({ status: { state: 'idle', findings: 1 } }).tooltip, /1 finding /);
  });

  it('says "not trusted" in an untrusted workspace, whatever the server says', () => {
    const shown = view({ trusted: false, status: { state: 'idle', findings: 0 } });
    assert.equal(shown.text, '$(shield) Precompile: not trusted');
    assert.match(shown.tooltip, /not trusted/);
  });

  it('shows the client lifecycle', () => {
    assert.equal(view({ client: 'starting' }).text, '$(sync~spin) Precompile');
    assert.equal(view({ client: 'stopped' }).text, '$(circle-slash) Precompile');
    const failed = view({ client: 'failed', error: 'cannot import precompile_lsp' });
    assert.equal(failed.text, '$(error) Precompile');
    assert.equal(failed.alert, 'error');
    assert.match(failed.tooltip, /cannot import precompile_lsp/);
    assert.equal(view({ enabled: false }).text, '$(circle-slash) Precompile: off');
    assert.equal(view({}).text, '$(check) Precompile');
  });

  it('always says a click shows the logs', () => {
    for (const client of ['starting', 'running', 'stopped', 'failed'] as const) {
      assert.match(view({ client }).tooltip, /show the logs/);
    }
  });
});

describe('parseStatus', () => {
  it('reads the notification and rejects anything else', () => {
    assert.deepEqual(parseStatus({ state: 'capturing', findings: 1, done: 0, total: 4 }), {
      state: 'capturing',
      findings: 1,
      done: 0,
      total: 4,
    });
    assert.deepEqual(parseStatus({ state: 'idle', findings: 0, extra: true }), { state: 'idle', findings: 0 });
    for (const bad of [null, undefined, 'idle', { state: 'busy', findings: 0 }, { state: 'idle' }, { state: 'idle', findings: '2' }]) {
      assert.equal(parseStatus(bad), undefined);
    }
  });
});
