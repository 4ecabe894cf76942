// What the .vsix holds: the bundle and the documents, nothing of the sources, tests,
// node_modules or maps; and a bundle that needs nothing but "vscode" and Node's builtins.
//
//   node test/package.test.mjs out/torch-precompile.vsix

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { dirname, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { inflateRawSync } from 'node:zlib';

const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const VSIX = resolve(PACKAGE, process.argv[2] ?? 'out/torch-precompile.vsix');

/** The entries of a zip archive, from its central directory: name -> reader of the data. */
function zipEntries(buffer) {
  const END = 0x06054b50;
  let end = -1;
  for (let at = buffer.length - 22; at >= Math.max(0, buffer.length - 22 - 0xffff); at--) {
    if (buffer.readUInt32LE(at) === END) {
      end = at;
      break;
    }
  }
  assert.ok(end >= 0, 'the vsix is a zip archive (end of central directory found)');
  const count = buffer.readUInt16LE(end + 10);
  let at = buffer.readUInt32LE(end + 16);
  const entries = new Map();
  for (let index = 0; index < count; index++) {
    assert.equal(buffer.readUInt32LE(at), 0x02014b50, 'a central directory header');
    const method = buffer.readUInt16LE(at + 10);
    const compressedSize = buffer.readUInt32LE(at + 20);
    const nameLength = buffer.readUInt16LE(at + 28);
    const extraLength = buffer.readUInt16LE(at + 30);
    const commentLength = buffer.readUInt16LE(at + 32);
    const localHeader = buffer.readUInt32LE(at + 42);
    const name = buffer.toString('utf8', at + 46, at + 46 + nameLength);
    entries.set(name, () => {
      const start = localHeader + 30 + buffer.readUInt16LE(localHeader + 26) + buffer.readUInt16LE(localHeader + 28);
      const data = buffer.subarray(start, start + compressedSize);
      return method === 0 ? data : inflateRawSync(data);
    });
    at += 46 + nameLength + extraLength + commentLength;
  }
  return entries;
}

const entries = zipEntries(readFileSync(VSIX));
const names = [...entries.keys()].sort();
console.log(`${VSIX}:\n  ${names.join('\n  ')}`);

test('the bundle, the manifest and the documents are in', () => {
  for (const name of ['extension/dist/extension.js', 'extension/package.json', 'extension.vsixmanifest']) {
    assert.ok(names.includes(name), `${name} is in the vsix`);
  }
  // vsce normalises the names: readme.md, changelog.md, LICENSE.txt.
  for (const pattern of [/^extension\/readme\.md$/i, /^extension\/changelog\.md$/i, /^extension\/license(\.txt|\.md)?$/i]) {
    assert.ok(names.some((name) => pattern.test(name)), `an entry matches ${pattern}`);
  }
});

test('no sources, tests, dependencies, TypeScript or maps', () => {
  const forbidden = [
    [/^extension\/src\//, 'src/'],
    [/^extension\/test\//, 'test/'],
    [/^extension\/out\//, 'out/'],
    [/node_modules\//, 'node_modules'],
    [/\.ts$/, '.ts files'],
    [/\.map$/, '.map files'],
    [/tsconfig[^/]*\.json$/, 'tsconfig'],
    [/package-lock\.json$/, 'package-lock.json'],
    [/\.vsix$/, 'another vsix'],
  ];
  for (const [pattern, what] of forbidden) {
    const found = names.filter((name) => pattern.test(name));
    assert.deepEqual(found, [], `no ${what} in the vsix`);
  }
  const files = names.filter((name) => name.startsWith('extension/'));
  assert.ok(files.length <= 6, `only the bundle and the documents (${files.join(', ')})`);
});

test('the manifest points at the bundle and keeps the engine', () => {
  const manifest = JSON.parse(entries.get('extension/package.json')().toString('utf8'));
  assert.equal(manifest.main, './dist/extension.js');
  assert.equal(manifest.engines.vscode, '^1.82.0');
  assert.equal(manifest.publisher, 'torch-precompile');
  assert.equal(manifest.name, 'torch-precompile');
  assert.equal(manifest.license, 'BSD-3-Clause');
  assert.equal(manifest.capabilities.untrustedWorkspaces.supported, 'limited');
  assert.deepEqual(manifest.capabilities.untrustedWorkspaces.restrictedConfigurations, ['precompile.interpreter']);
  const properties = manifest.contributes.configuration.properties;
  assert.equal(properties['precompile.interpreter'].scope, 'machine-overridable');
  const commands = manifest.contributes.commands.map((c) => c.command);
  for (const serverCommand of ['precompile.emit', 'precompile.verify', 'precompile.recheck']) {
    assert.ok(!commands.includes(serverCommand), `${serverCommand} is left to vscode-languageclient`);
  }
});

test('the bundle requires only "vscode" and Node builtins', () => {
  const bundle = entries.get('extension/dist/extension.js')().toString('utf8');
  const required = new Set([...bundle.matchAll(/\brequire\(\s*["']([^"']+)["']\s*\)/g)].map((m) => m[1]));
  const builtins = new Set(builtinModules.flatMap((m) => [m, `node:${m}`]));
  const foreign = [...required].filter((name) => name !== 'vscode' && !builtins.has(name));
  assert.deepEqual(foreign, [], 'every other module is bundled');
  assert.ok(required.has('vscode'), 'vscode stays external');
  assert.ok(!bundle.includes('sourceMappingURL'), 'no source map reference');
});
