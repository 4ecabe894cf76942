// A stand-in for the "vscode" module, enough to load the bundle and run activate() in
// plain Node: what the extension itself calls is modelled (and recorded in `seen`);
// everything else, which vscode-languageclient touches, is an inert object usable as a
// class, a function or a value.

import Module, { createRequire } from 'node:module';
import { dirname, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(import.meta.url);

/** Usable as anything vscode-languageclient touches at load time: a class, a function, an object. */
function anything() {
  const target = function () {};
  return new Proxy(target, {
    get(t, property) {
      if (property === 'prototype') {
        return t.prototype;
      }
      if (property === Symbol.toPrimitive) {
        return () => '';
      }
      if (property === Symbol.iterator) {
        return function* () {};
      }
      if (property === 'then' || typeof property === 'symbol') {
        return undefined;
      }
      return anything();
    },
    apply: () => anything(),
    construct: () => anything(),
  });
}

function fileUri(path) {
  const href = pathToFileURL(path).href;
  return { scheme: 'file', fsPath: path, path, toString: () => href, toJSON: () => href };
}

/** `object`, with anything() for every property it lacks, at every level. */
function rest(object) {
  return new Proxy(object, {
    get(target, property) {
      if (!(property in target)) {
        return typeof property === 'symbol' || property === 'then' ? undefined : anything();
      }
      const value = target[property];
      const plain = value !== null && typeof value === 'object' && Object.getPrototypeOf(value) === Object.prototype;
      return plain ? rest(value) : value;
    },
  });
}

export function fakeVscode({ trusted, interpreter, settings = {}, folder }) {
  const seen = { errors: [], commands: [], created: [], logs: {}, texts: [], item: undefined };
  const event = () => () => ({ dispose() {} });
  const channel = (name) => {
    seen.created.push(name);
    const lines = [];
    seen.logs[name] = lines;
    return {
      name,
      lines,
      info: (m) => lines.push(m),
      warn: (m) => lines.push(m),
      error: (m) => lines.push(m),
      trace() {},
      debug() {},
      append: (m) => lines.push(m),
      appendLine: (m) => lines.push(m),
      show() {},
      clear() {},
      dispose() {},
    };
  };
  const api = {
    version: '1.82.0',
    env: { appName: 'Fake Code', language: 'en', machineId: 'fake', sessionId: 'fake', uriScheme: 'vscode' },
    StatusBarAlignment: { Left: 1, Right: 2 },
    ProgressLocation: { SourceControl: 1, Window: 10, Notification: 15 },
    ThemeColor: class {
      constructor(id) {
        this.id = id;
      }
    },
    window: {
      createOutputChannel: (name) => channel(name),
      createStatusBarItem: (id) => {
        let text = '';
        seen.item = {
          id,
          tooltip: '',
          get text() {
            return text;
          },
          set text(value) {
            text = value;
            if (seen.texts.at(-1) !== value) {
              seen.texts.push(value);
            }
          },
          show() {},
          hide() {},
          dispose() {},
        };
        return seen.item;
      },
      showErrorMessage: async (message, ...buttons) => {
        seen.errors.push({ message, buttons });
        return undefined;
      },
      showWarningMessage: async () => undefined,
      showInformationMessage: async () => undefined,
      activeTextEditor: undefined,
    },
    workspace: {
      isTrusted: trusted,
      workspaceFolders: folder ? [{ uri: fileUri(folder), name: 'folder', index: 0 }] : undefined,
      getWorkspaceFolder: () => undefined,
      getConfiguration: () => ({
        get: (key, fallback) => (key in settings ? settings[key] : fallback),
        inspect: (key) => (key === 'interpreter' ? interpreter : undefined),
      }),
      onDidGrantWorkspaceTrust: (listener) => {
        seen.grantTrust = () => {
          api.workspace.isTrusted = true;
          listener();
        };
        return { dispose() {} };
      },
      onDidChangeConfiguration: event(),
    },
    commands: {
      registerCommand: (id) => {
        seen.commands.push(id);
        return { dispose() {} };
      },
      executeCommand: async () => undefined,
    },
    extensions: { getExtension: () => undefined },
  };
  return { seen, module: rest(api) };
}

export async function activateWith(options, until = (seen) => seen.errors.length > 0, timeoutMs = 30_000) {
  const fake = fakeVscode(options);
  const load = Module._load;
  Module._load = function (request, ...rest) {
    return request === 'vscode' ? fake.module : load.call(this, request, ...rest);
  };
  const bundle = resolve(PACKAGE, 'dist/extension.js');
  delete require.cache[bundle];
  try {
    const extension = require(bundle);
    const context = { subscriptions: [] };
    extension.activate(context);
    // Activation starts the server in the background: wait for the probe to answer.
    const deadline = Date.now() + timeoutMs;
    while (!until(fake.seen) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 50));
    }
    await extension.deactivate();
    for (const disposable of context.subscriptions) {
      disposable.dispose();
    }
    return fake.seen;
  } finally {
    Module._load = load;
  }
}
