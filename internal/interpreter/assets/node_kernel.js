'use strict';
// agentbox code interpreter: the JavaScript/TypeScript kernel.
//
// Cells run in one persistent node:repl context, which gives let/const
// bindings that survive across cells, top-level await and the value of the
// last expression. The Go server turns TypeScript and import statements into
// plain JavaScript before a cell gets here.
//
// Protocol with the server:
//   stdin, one JSON object per line:
//     {"id": N, "code": "..."}   run a cell
//     {"interrupt": N}           stop cell N while it waits (await); code
//                                 that keeps the CPU busy is stopped by the
//                                 server with SIGINT instead
//   fd 3, one JSON object per line:
//     {"type": "ready"}                                      once, at start
//     {"id": N, "type": "stdout"|"stderr", "text": "..."}
//     {"id": N, "type": "result", "main": bool, "data": {mime: value}}
//     {"id": N, "type": "error", "ename", "evalue", "traceback"}
//     {"id": N, "type": "done"}
// Events are written synchronously, so a slow reader slows the kernel down
// instead of piling output up in memory, and they are ordered: everything a
// cell printed precedes its "done".

const fs = require('node:fs');
const readline = require('node:readline');
const repl = require('node:repl');
const util = require('node:util');
const { PassThrough } = require('node:stream');

const EVENTS_FD = 3;
const MAX_TEXT = 1 << 20; // split larger writes so no event line gets huge

function send(ev) {
  const buf = Buffer.from(JSON.stringify(ev) + '\n');
  let off = 0;
  while (off < buf.length) {
    try {
      off += fs.writeSync(EVENTS_FD, buf, off, buf.length - off);
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
    }
  }
}

let current = null; // the running cell: {id, finished}
let lastId = 0; // output after a cell ended (timers) is reported under it
const queue = [];

function emitText(type, text) {
  const id = current ? current.id : lastId;
  for (let i = 0; i < text.length; i += MAX_TEXT) {
    send({ id, type, text: text.slice(i, i + MAX_TEXT) });
  }
}

for (const name of ['stdout', 'stderr']) {
  process[name].write = function write(chunk, encoding, cb) {
    if (typeof encoding === 'function') {
      cb = encoding;
      encoding = undefined;
    }
    const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString(encoding || 'utf8');
    emitText(name, text);
    if (typeof cb === 'function') process.nextTick(cb);
    return true;
  };
}

function isBundle(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v) &&
    Object.keys(v).length > 0 && Object.keys(v).every((k) => k.includes('/'));
}

function toBundle(v) {
  if (isBundle(v)) {
    const out = {};
    for (const [k, val] of Object.entries(v)) out[k] = val;
    if (!('text/plain' in out)) out['text/plain'] = '';
    return out;
  }
  // A string's text is the string itself (the server strips the quotes
  // of a repr; util.inspect would pick backticks for some strings).
  if (typeof v === 'string') return { 'text/plain': "'" + v + "'" };
  return { 'text/plain': util.inspect(v, { depth: 6, maxArrayLength: 200, maxStringLength: 100000, breakLength: 100 }) };
}

// display(value) shows a value, or a MIME bundle such as
// {'text/html': '<b>hi</b>'} or {'image/png': base64}, as a non-main result.
function display(v) {
  send({ id: current ? current.id : lastId, type: 'result', main: false, data: toBundle(v) });
}

const internalFrame = /\((node:|internal\/)|^\s*at (node:|REPLServer|bound |Script\.run|runInContext)/;

function describe(e) {
  if (e instanceof repl.Recoverable) e = e.err; // incomplete input
  if (util.types.isNativeError(e) || (e !== null && typeof e === 'object' && 'message' in e && 'name' in e)) {
    let name = String(e.name || 'Error');
    let value = String(e.message);
    if (/interrupted by `SIGINT`/.test(value)) {
      name = 'Interrupted';
      value = 'execution was interrupted';
    }
    const stack = String(e.stack || `${name}: ${value}`)
      .split('\n')
      .filter((line) => !internalFrame.test(line))
      .join('\n');
    return { ename: name, evalue: value, traceback: stack };
  }
  const shown = util.inspect(e);
  return { ename: 'Error', evalue: shown, traceback: 'Uncaught ' + shown };
}

const r = repl.start({
  input: new PassThrough(),
  output: new PassThrough(),
  terminal: false,
  useGlobal: false,
  breakEvalOnSigint: true,
  prompt: '',
  ignoreUndefined: true,
});
r.context.console = console;
r.context.display = display;

function finish(cell, err, value) {
  if (!cell || cell.finished) return;
  cell.finished = true;
  if (current === cell) current = null;
  if (err !== undefined) {
    send({ id: cell.id, type: 'error', ...describe(err) });
  } else if (value !== undefined) {
    send({ id: cell.id, type: 'result', main: true, data: toBundle(value) });
  }
  send({ id: cell.id, type: 'done' });
  setImmediate(next);
}

// node:repl evaluates inside a domain: a throw during a cell, synchronous or
// after an await, arrives here instead of at the eval callback.
if (r._domain) {
  r._domain.removeAllListeners('error');
  r._domain.on('error', (err) => {
    if (current) finish(current, err);
    else emitText('stderr', 'Uncaught ' + describe(err).traceback + '\n');
  });
}
process.on('uncaughtException', (err) => {
  if (current) finish(current, err);
  else emitText('stderr', 'Uncaught ' + describe(err).traceback + '\n');
});
process.on('unhandledRejection', (err) => {
  emitText('stderr', 'Unhandled promise rejection: ' + describe(err).traceback + '\n');
});

function run(req) {
  const cell = { id: req.id, finished: false };
  current = cell;
  lastId = req.id;
  try {
    r.eval(req.code, r.context, 'cell', (err, value) => {
      if (err) finish(cell, err);
      else finish(cell, undefined, value);
    });
  } catch (e) {
    finish(cell, e);
  }
}

function next() {
  if (current || queue.length === 0) return;
  run(queue.shift());
}

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on('line', (line) => {
  let req;
  try {
    req = JSON.parse(line);
  } catch {
    return;
  }
  if (typeof req.interrupt === 'number') {
    if (current && current.id === req.interrupt) {
      finish(current, Object.assign(new Error('execution was interrupted'), { name: 'Interrupted', stack: 'Interrupted: execution was interrupted' }));
    }
    return;
  }
  queue.push(req);
  next();
});
rl.on('close', () => process.exit(0));

send({ type: 'ready' });
