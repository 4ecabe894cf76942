// Strict-framing smoke test: the real language server, driven over stdio by
// vscode-jsonrpc (the library vscode-languageclient uses), on a fresh copy of
// tests/fixtures/lsp_workspace. Any framing error, or the connection closing before
// shutdown, fails the test: the fixture's `noisy` target prints and writes a fake LSP
// header to fd 1 from C while it is captured, which must never reach the protocol.
//
//   PRECOMPILE_PYTHON=/path/to/python node test/smoke.mjs
//
// PRECOMPILE_SMOKE_WAIT (seconds, default 240) bounds the wait for the first check.

import { spawn } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import rpc from 'vscode-jsonrpc/node.js';

const HERE = dirname(fileURLToPath(import.meta.url));
const PACKAGE = resolve(HERE, '..');
const REPO = resolve(PACKAGE, '..', '..');
const PYTHON = resolve(PACKAGE, process.env.PRECOMPILE_PYTHON || '../../.venv/bin/python');
const WAIT_MS = Number(process.env.PRECOMPILE_SMOKE_WAIT || 240) * 1000;
const REQUEST_MS = 120_000;

const started = Date.now();
const log = (message) => console.log(`[smoke +${((Date.now() - started) / 1000).toFixed(1)}s] ${message}`);

let failed = false;
function check(condition, message) {
  if (!condition) {
    failed = true;
    console.error(`FAIL: ${message}`);
  } else {
    log(`ok: ${message}`);
  }
}

function within(ms, promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms / 1000}s waiting for ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** Resolves when predicate() is truthy (checked on every message), rejects on a protocol failure. */
function until(predicate, what, ms = WAIT_MS) {
  return within(
    ms,
    new Promise((resolveWait, rejectWait) => {
      const poll = () => {
        if (protocolFailure) {
          rejectWait(protocolFailure);
          return true;
        }
        const value = predicate();
        if (value) {
          resolveWait(value);
          return true;
        }
        return false;
      };
      if (!poll()) {
        waiters.add(poll);
      }
    }),
    what,
  );
}
const waiters = new Set();
function wake() {
  for (const poll of [...waiters]) {
    if (poll()) {
      waiters.delete(poll);
    }
  }
}

// ---------------------------------------------------------------- the workspace and the server

const root = mkdtempSync(join(tmpdir(), 'precompile-smoke-'));
const workspace = join(root, 'lab');
cpSync(join(REPO, 'tests', 'fixtures', 'lsp_workspace'), workspace, { recursive: true });
const uri = (relative) => pathToFileURL(join(workspace, relative)).href;

log(`server: ${PYTHON} -m precompile_lsp in ${workspace}`);
const env = { ...process.env, PYTHONPATH: [REPO, process.env.PYTHONPATH].filter(Boolean).join(':') };
const server = spawn(PYTHON, ['-m', 'precompile_lsp'], {
  cwd: workspace,
  env,
  stdio: ['pipe', 'pipe', 'pipe'],
  detached: true, // its own process group, so a failed run can take its workers down too
});
let stderr = '';
server.stderr.on('data', (chunk) => {
  stderr += chunk.toString();
});
const exited = new Promise((resolveExit) => {
  server.on('exit', (code, signal) => resolveExit({ code, signal }));
});
let serverError;
server.on('error', (error) => {
  serverError = error;
  protocolFailure = error;
  wake();
});

let protocolFailure;
let shuttingDown = false;
const connection = rpc.createMessageConnection(
  new rpc.StreamMessageReader(server.stdout),
  new rpc.StreamMessageWriter(server.stdin),
);
connection.onError(([error]) => {
  protocolFailure = new Error(`protocol error from vscode-jsonrpc: ${error?.message ?? error}`);
  failed = true;
  console.error(`FAIL: ${protocolFailure.message}`);
  wake();
});
connection.onClose(() => {
  if (!shuttingDown) {
    protocolFailure = new Error('the connection closed before shutdown');
    failed = true;
    console.error(`FAIL: ${protocolFailure.message}`);
    wake();
  }
});

// ---------------------------------------------------------------- what the server sends

const statuses = [];
const diagnostics = new Map();
const serverRequests = [];
const messages = [];

connection.onNotification('precompile/status', (params) => {
  statuses.push(params);
  log(`status ${JSON.stringify(params)}`);
  wake();
});
connection.onNotification('textDocument/publishDiagnostics', (params) => {
  diagnostics.set(params.uri, params.diagnostics);
  wake();
});
connection.onNotification('window/showMessage', (params) => {
  messages.push(params.message);
  log(`showMessage: ${params.message}`);
});
connection.onNotification('window/logMessage', (params) => messages.push(params.message));
connection.onNotification('$/progress', () => undefined);
connection.onNotification((method) => log(`notification ${method}`));

connection.onRequest('client/registerCapability', (params) => {
  serverRequests.push('client/registerCapability');
  return null;
});
connection.onRequest('client/unregisterCapability', () => null);
connection.onRequest('workspace/configuration', (params) => {
  serverRequests.push('workspace/configuration');
  return params.items.map(() => ({}));
});
connection.onRequest('window/workDoneProgress/create', () => {
  serverRequests.push('window/workDoneProgress/create');
  return null;
});
connection.onRequest('workspace/codeLens/refresh', () => {
  serverRequests.push('workspace/codeLens/refresh');
  return null;
});
connection.onRequest((method) => {
  serverRequests.push(method);
  log(`unexpected request ${method}; answering null`);
  return null;
});
connection.listen();

function request(method, params) {
  return within(REQUEST_MS, connection.sendRequest(method, params), method);
}

const codes = (relative) => (diagnostics.get(uri(relative)) ?? []).map((d) => d.code).sort();

// ---------------------------------------------------------------- the session

async function session() {
  const result = await request('initialize', {
    processId: process.pid,
    clientInfo: { name: 'precompile-smoke' },
    rootUri: pathToFileURL(workspace).href,
    workspaceFolders: [{ uri: pathToFileURL(workspace).href, name: 'lab' }],
    initializationOptions: { trusted: true, settings: {} },
    capabilities: {
      general: { positionEncodings: ['utf-16'] },
      workspace: {
        configuration: true,
        workspaceFolders: true,
        didChangeConfiguration: { dynamicRegistration: true },
        didChangeWatchedFiles: { dynamicRegistration: true },
        executeCommand: { dynamicRegistration: true },
        codeLens: { refreshSupport: true },
      },
      window: { workDoneProgress: true, showMessage: {} },
      textDocument: {
        synchronization: { dynamicRegistration: true, didSave: true },
        publishDiagnostics: { relatedInformation: true, codeDescriptionSupport: true, dataSupport: true },
        hover: { contentFormat: ['markdown', 'plaintext'] },
        codeLens: {},
        codeAction: {
          codeActionLiteralSupport: { codeActionKind: { valueSet: ['', 'quickfix', 'source'] } },
          dataSupport: true,
        },
      },
    },
  });
  const commands = result?.capabilities?.executeCommandProvider?.commands ?? [];
  check(
    ['precompile.emit', 'precompile.verify', 'precompile.recheck'].every((c) => commands.includes(c)),
    `initialize lists the server commands (${commands.join(', ')})`,
  );
  await connection.sendNotification('initialized', {});

  // The first check: capturing, then idle once the findings are published.
  await until(() => {
    const capturing = statuses.findIndex((s) => s.state === 'capturing');
    return capturing >= 0 && statuses.slice(capturing).some((s) => s.state === 'idle');
  }, 'the first check to finish');
  check(codes('src/lab/helpers.py').includes('PC101'), `helpers.py has PC101 (${codes('src/lab/helpers.py')})`);
  check(codes('src/lab/noisy.py').includes('PC101'), `noisy.py has PC101 (${codes('src/lab/noisy.py')})`);
  check(
    readFileSync(join(workspace, 'noisy-ran.txt'), 'utf8') === 'captured\n',
    'the noisy target really ran (and wrote to fd 1)',
  );
  check(serverRequests.includes('workspace/configuration'), 'the server asked for its configuration');

  // Requests on an open document all answer.
  const serving = readFileSync(join(workspace, 'src/lab/serving.py'), 'utf8');
  await connection.sendNotification('textDocument/didOpen', {
    textDocument: { uri: uri('src/lab/serving.py'), languageId: 'python', version: 1, text: serving },
  });
  const lines = serving.split('\n');
  const shippedDecorator = lines.findIndex((line) => line.includes('artifact="artifacts/lab.serving.shipped.py"'));

  const [breaks] = diagnostics.get(uri('src/lab/helpers.py')) ?? [];
  const hover = await request('textDocument/hover', {
    textDocument: { uri: uri('src/lab/helpers.py') },
    position: breaks.range.start,
  });
  check(typeof hover?.contents?.value === 'string' && hover.contents.value.length > 0, 'hover on the graph break answers markdown');
  const servingHover = await request('textDocument/hover', {
    textDocument: { uri: uri('src/lab/serving.py') },
    position: { line: shippedDecorator, character: 1 },
  });
  check(servingHover === null || typeof servingHover === 'object', 'hover on serving.py answers');

  const lenses = await request('textDocument/codeLens', { textDocument: { uri: uri('src/lab/serving.py') } });
  const lensCommands = (lenses ?? []).map((lens) => lens.command?.command);
  check(
    Array.isArray(lenses) && lensCommands.filter((c) => c === 'precompile.emit').length === 3,
    `codeLens on serving.py answers an Emit lens per target (${lenses?.length} lenses)`,
  );

  // What the extension's "Emit Artifact" asks: source actions at the target's decorator.
  const actions = await request('textDocument/codeAction', {
    textDocument: { uri: uri('src/lab/serving.py') },
    range: { start: { line: shippedDecorator, character: 0 }, end: { line: shippedDecorator, character: 0 } },
    context: { diagnostics: [], only: ['source'] },
  });
  const emit = (actions ?? []).find((action) => action.command?.command === 'precompile.emit');
  check(
    emit !== undefined && emit.command.arguments[0] === uri('src/lab/serving.py') && emit.command.arguments[1] === 'lab.serving.shipped',
    `codeAction on serving.py offers emit of lab.serving.shipped (${JSON.stringify(emit?.command)})`,
  );
  check(
    (actions ?? []).some((action) => action.command?.command === 'precompile.verify'),
    'codeAction on serving.py offers verify',
  );

  const rechecked = await request('workspace/executeCommand', { command: 'precompile.recheck', arguments: [] });
  check(typeof rechecked === 'string' && /rechecked/.test(rechecked), `precompile.recheck answers (${JSON.stringify(rechecked)})`);
  check(codes('src/lab/helpers.py').includes('PC101'), 'helpers.py still has PC101 after the recheck');

  // Shut down: the server answers, exits 0 on exit, and the stream stayed well framed.
  shuttingDown = true;
  await request('shutdown', null);
  await connection.sendNotification('exit');
  const { code, signal } = await within(30_000, exited, 'the server to exit');
  check(code === 0, `the server exited 0 after exit (code ${code}, signal ${signal})`);
  check(protocolFailure === undefined, 'no framing error or early close');
}

let outcome = 0;
try {
  await session();
} catch (error) {
  failed = true;
  console.error(`FAIL: ${error?.stack ?? error}`);
} finally {
  if (failed) {
    outcome = 1;
    console.error(`--- server stderr (last 4000 characters) ---\n${stderr.slice(-4000)}`);
    console.error(`--- statuses ---\n${JSON.stringify(statuses)}`);
    console.error(`--- diagnostics ---\n${JSON.stringify([...diagnostics.keys()])}`);
    if (serverError) {
      console.error(`--- spawn error ---\n${serverError}`);
    }
  }
  connection.dispose();
  if (failed && server.pid !== undefined) {
    try {
      process.kill(-server.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  rmSync(root, { recursive: true, force: true });
}
log(outcome === 0 ? 'smoke test passed' : 'smoke test FAILED');
process.exit(outcome);
