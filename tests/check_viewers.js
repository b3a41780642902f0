// SPDX-License-Identifier: Apache-2.0
// check_viewers.js: opens snapshot pickles with PyTorch's own memory viewer code, under node
// (run by tests/test_trace_viewers.cpp; usable by hand).
//
//   node check_viewers.js VIEWER.js SNAPSHOT [--conf TEXT] [--min-framed N]
//
// VIEWER.js is a copy of PyTorch's torch/utils/viz/MemoryViz.js (a test fixture kept outside
// the repository, ../shared/reference/pytorch-viewer/). Its own functions are taken from the
// file's text and run unchanged: unpickle(buffer) (the viewer refuses integers wider than 8
// bytes in older versions and reads them as BigInt in newer ones), then
// annotate_snapshot(snapshot) (what the viewer does to every snapshot before drawing). Checks,
// exit status 1 with one line per failure:
//   - unpickle and annotate_snapshot do not throw;
//   - no value anywhere is a BigInt, and no integer is beyond 2^53 (the viewer's Numbers);
//   - JSON.stringify(snapshot.allocator_settings, null, 2) does not throw (the Allocator
//     Settings tab of the newest viewer shows exactly that);
//   - every trace entry has the string keys compile_context and user_metadata;
//   - --conf TEXT: allocator_settings.PYTORCH_CUDA_ALLOC_CONF is TEXT;
//   - --min-framed N: at least N blocks of live allocations carry frames.
// Prints one summary line on success.
'use strict';
const fs = require('fs');
const vm = require('vm');

const args = process.argv.slice(2);
if (args.length < 2) {
  console.error('usage: node check_viewers.js VIEWER.js SNAPSHOT [--conf TEXT] [--min-framed N]');
  process.exit(2);
}
const [viewerPath, snapPath] = args;
let conf = null, minFramed = 0;
for (let i = 2; i < args.length; i += 2) {
  if (args[i] === '--conf') conf = args[i + 1];
  else if (args[i] === '--min-framed') minFramed = Number(args[i + 1]);
  else { console.error(`unknown argument ${args[i]}`); process.exit(2); }
}

const errors = [];
const fail = (m) => errors.push(m);

// A top-level function of the viewer, by name: its text up to the next top-level function.
function viewerFunction(text, name) {
  const start = text.indexOf(`\nfunction ${name}(`);
  if (start < 0) return null;
  const end = text.indexOf('\nfunction ', start + 1);
  return text.slice(start, end < 0 ? undefined : end);
}

const viewer = fs.readFileSync(viewerPath, 'utf8');
const names = ['unpickle', 'version_space', 'annotate_snapshot'];
const parts = names.map((n) => viewerFunction(viewer, n));
if (parts[0] === null) {
  console.error(`${viewerPath}: no function unpickle(buffer): not a MemoryViz.js`);
  process.exit(2);
}
const ctx = vm.createContext({TextDecoder, Uint8Array, ArrayBuffer, BigInt64Array,
                              Float64Array, BigInt, Number, Error, Array, Infinity});
vm.runInContext(parts.filter((p) => p !== null).join('\n'), ctx);

const file = fs.readFileSync(snapPath);
const buffer = file.buffer.slice(file.byteOffset, file.byteOffset + file.length);
let snap = null;
try {
  snap = ctx.unpickle(buffer);
} catch (e) {
  fail(`unpickle throws: ${e.message}`);
}

function walk(v, where, seen) {
  if (typeof v === 'bigint') {
    fail(`${where} is a BigInt (${v}): an integer wider than 8 bytes`);
  } else if (typeof v === 'number' && Number.isInteger(v) && !Number.isSafeInteger(v)) {
    fail(`${where} is ${v}: beyond 2^53, the viewer's Numbers lose it`);
  } else if (v !== null && typeof v === 'object') {
    if (seen.has(v)) return; // frames are shared (memo)
    seen.add(v);
    for (const k of Object.keys(v)) {
      if (errors.length > 20) return;
      walk(v[k], `${where}.${k}`, seen);
    }
  }
}

let events = 0, framed = 0;
if (snap !== null) {
  if (typeof snap !== 'object' || !Array.isArray(snap.segments) ||
      !Array.isArray(snap.device_traces) || typeof snap.allocator_settings !== 'object') {
    fail('the snapshot is not a dict with segments, device_traces and allocator_settings');
  } else {
    walk(snap, 'snapshot', new Set());
    try {
      JSON.stringify(snap.allocator_settings, null, 2);
    } catch (e) {
      fail(`JSON.stringify(allocator_settings) throws: ${e.message}`);
    }
    if (conf !== null && snap.allocator_settings.PYTORCH_CUDA_ALLOC_CONF !== conf)
      fail(`PYTORCH_CUDA_ALLOC_CONF is ${JSON.stringify(snap.allocator_settings.PYTORCH_CUDA_ALLOC_CONF)}, expected ${JSON.stringify(conf)}`);
    for (const [d, trace] of snap.device_traces.entries()) {
      for (const [i, t] of trace.entries()) {
        events++;
        for (const k of ['compile_context', 'user_metadata'])
          if (typeof t[k] !== 'string' && errors.length < 20)
            fail(`device_traces[${d}][${i}].${k} is ${t[k]}, expected a string`);
      }
    }
    for (const s of snap.segments)
      for (const b of s.blocks)
        if (b.state === 'active_allocated' && b.frames.length > 0) framed++;
    if (framed < minFramed) fail(`${framed} live blocks carry frames, expected at least ${minFramed}`);
    if (typeof ctx.annotate_snapshot === 'function') {
      try {
        ctx.annotate_snapshot(snap);
      } catch (e) {
        fail(`annotate_snapshot throws: ${e.message}`);
      }
    } else {
      fail(`${viewerPath}: no annotate_snapshot to run`);
    }
  }
}

for (const e of errors) console.log(`${snapPath}: ${e}`);
if (errors.length) process.exit(1);
console.log(`${snapPath}: opens in ${viewerPath.split('/').pop()}: ${snap.segments.length} segments, ` +
            `${events} events, ${framed} live blocks with frames`);
