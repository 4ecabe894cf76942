import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { pickTargetCommand, targetDecoratorLine } from '../../src/targetAtCursor';

const SERVING = [
  'import precompile', //                          0
  'from lab.layers import make_calls', //          1
  '', //                                           2
  '', //                                           3
  '@precompile.target(make_calls)', //             4
  'def clean(model, x):', //                       5
  '    y = model(x)', //                           6
  '', //                                           7
  '    # a comment at column 0 would not end it', // 8
  '    return y.relu()', //                        9
  '', //                                           10
  '', //                                           11
  'def helper(x):', //                             12
  '    return x', //                               13
  '', //                                           14
  '@precompile.target(', //                        15
  '    make_calls,', //                            16
  '    artifact="artifacts/shipped.py",', //       17
  ')', //                                          18
  '@functools.wraps(other)', //                    19
  'async def shipped(model, x):', //               20
  '    return model(x) * 2', //                    21
  '', //                                           22
  'class Server:', //                              23
  '    @precompile.target(make_calls)', //         24
  '    def method(self, model, x):', //            25
  '        return model(x)', //                    26
  '', //                                           27
  '    def other(self):', //                       28
  '        pass', //                               29
].join('\n');

describe('targetDecoratorLine', () => {
  it('finds the decorator from the decorator, the def and the body', () => {
    for (const line of [4, 5, 6, 7, 8, 9, 10]) {
      assert.equal(targetDecoratorLine(SERVING, line), 4, `line ${line}`);
    }
  });

  it('handles multi-line decorators and other decorators between', () => {
    for (const line of [15, 16, 18, 19, 20, 21]) {
      assert.equal(targetDecoratorLine(SERVING, line), 15, `line ${line}`);
    }
  });

  it('handles methods', () => {
    for (const line of [24, 25, 26]) {
      assert.equal(targetDecoratorLine(SERVING, line), 24, `line ${line}`);
    }
  });

  it('answers undefined outside targets', () => {
    for (const line of [0, 1, 2, 12, 13, 23, 28, 29]) {
      assert.equal(targetDecoratorLine(SERVING, line), undefined, `line ${line}`);
    }
  });

  it('accepts a bare @target and CRLF text, and clamps the line', () => {
    const text = 'from precompile import target\r\n@target(calls)\r\ndef f(m, x):\r\n    return x\r\n';
    assert.equal(targetDecoratorLine(text, 3), 1);
    assert.equal(targetDecoratorLine(text, 99), 1);
    assert.equal(targetDecoratorLine('@precompile.target(calls)\n', 0), undefined); // no def
    assert.equal(targetDecoratorLine('@precompile.target(x)\nclass C:\n    pass\n', 2), undefined);
  });
});

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
