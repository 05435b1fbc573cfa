// readers.js answers, for policy's TestPathReaders, which of JavaScript's
// ways of comparing text without case take two paths for the same; the
// protocol is Readers.java's.
'use strict';
const lines = require('fs').readFileSync(0, 'utf8').split('\n');
const out = [];
const quote = (s) => s.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');
lines.forEach((line, i) => {
  if (line === '') return;
  const [rule, s] = line.split('\t');
  if (new RegExp('^' + quote(rule) + '$', 'iu').test(s)) out.push(`row\t${i}\tjavascript RegExp /iu`);
  if (new RegExp('^' + quote(rule) + '$', 'i').test(s)) out.push(`row\t${i}\tjavascript RegExp /i`);
  if (rule.toLowerCase() === s.toLowerCase()) out.push(`row\t${i}\tjavascript toLowerCase`);
  if (rule.toUpperCase() === s.toUpperCase()) out.push(`row\t${i}\tjavascript toUpperCase`);
});
const alnum = 'abcdefghijklmnopqrstuvwxyz0123456789';
const anyU = /^[a-z0-9]$/iu;
const anyI = /^[a-z0-9]$/i;
const image = (reader, cp, img) => {
  if (/^[\x00-\x7f]*$/.test(img)) out.push(`char\t${reader}\t${cp.toString(16)}\t${img}`);
};
for (let cp = 0x80; cp <= 0x10ffff; cp++) {
  if (cp >= 0xd800 && cp <= 0xdfff) continue;
  const c = String.fromCodePoint(cp);
  for (const [reader, any, flags] of [['javascript RegExp /iu', anyU, 'iu'], ['javascript RegExp /i', anyI, 'i']]) {
    if (!any.test(c)) continue;
    for (const x of alnum) {
      if (new RegExp('^' + x + '$', flags).test(c)) out.push(`char\t${reader}\t${cp.toString(16)}\t${x}`);
    }
  }
  image('javascript toLowerCase', cp, c.toLowerCase());
  image('javascript toUpperCase', cp, c.toUpperCase());
}
process.stdout.write(out.join('\n') + '\n');
