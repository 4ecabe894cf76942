import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { pickTargetCommand } from '../../src/targetAtCursor';

describe('pickTargetCommand', () => {
  const emit = { title: 'Emit precompile artifact', command: 'precompile.emit', arguments: ['file:///s.py', 'lab.s.f'] };
  const verify = { title: 'Verify artifact', command: 'precompile.verify', arguments: ['file:///s.py', 'lab.s.f'] };

  it('picks the code action running the command', () => {
    const actions = [
      { title: 'Emit precompile artifact', kind: 'source.precompile', command: emit },
      { title: 'Verify artifact', kind: 'source.precompile', command: verify },
    ];
    assert.deepEqual(pickTargetCommand(actions, 'precompile.verify'), verify);
    assert.deepEqual(pickTargetCommand(actions, 'precompile.emit'), emit);
  });

  it('accepts bare commands and skips actions without one', () => {
    assert.deepEqual(pickTargetCommand([{ title: 'edit only', edit: {} }, verify], 'precompile.verify'), verify);
  });

  it('answers undefined when nothing matches', () => {
    assert.equal(pickTargetCommand([], 'precompile.emit'), undefined);
    assert.equal(pickTargetCommand(null, 'precompile.emit'), undefined);
    assert.equal(pickTargetCommand([{ command: verify }], 'precompile.emit'), undefined);
  });
});
