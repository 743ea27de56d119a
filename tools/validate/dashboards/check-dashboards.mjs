// Type-checks Grafana dashboards against @grafana/schema with tsc --strict.
//
//   node check-dashboards.mjs DASHBOARD.json...
//
// Each dashboard becomes a TypeScript module in .check/PID/ whose object literal
// is typed as the schema's Dashboard (types.ts: Json<Dashboard>), and each
// panel's `options` and `fieldConfig.defaults.custom` as its plugin's own
// Options/FieldConfig; then one tsc run (tsconfig.json's options) checks
// them all. The directory is removed when the dashboards pass.
// Unknown keys, wrong types, missing required keys, bad enum values and
// unknown panel types are errors. Exit 0 only when tsc finds nothing.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const files = process.argv.slice(2);
if (files.length === 0) {
  console.error('usage: node check-dashboards.mjs DASHBOARD.json...');
  process.exit(2);
}
const KNOWN = ['bargauge', 'geomap', 'stat', 'state-timeline', 'table', 'text', 'timeseries'];
const out = path.join(here, '.check', String(process.pid));
fs.rmSync(out, { recursive: true, force: true });
fs.mkdirSync(out, { recursive: true });

const lit = (v) => JSON.stringify(v, null, 1);
const index = [];
files.forEach((f, n) => {
  const d = JSON.parse(fs.readFileSync(f, 'utf8'));
  const lines = [
    `// ${path.resolve(f)}`,
    "import type { DashboardJson, PanelTypes } from '../../types';",
    `export const dashboard: DashboardJson = ${lit(d)};`,
  ];
  const panels = (d.panels ?? []).flatMap((p) => [p, ...(p.type === 'row' ? (p.panels ?? []) : [])]);
  for (const p of panels) {
    if (p.type === 'row') continue;
    // An unknown plugin id fails here: PanelTypes has no such key.
    const t = KNOWN.includes(p.type) ? `'${p.type}'` : `'unknown panel type ${p.type}'`;
    lines.push(`export const options_${p.id}: PanelTypes[${t}]['options'] = ${lit(p.options ?? {})};`);
    const custom = p.fieldConfig?.defaults?.custom;
    if (custom !== undefined) {
      lines.push(`export const custom_${p.id}: PanelTypes[${t}]['custom'] = ${lit(custom)};`);
    }
  }
  const ts = path.join(out, `d${n}.ts`);
  fs.writeFileSync(ts, lines.join('\n') + '\n');
  index.push(`${path.relative(here, ts)} <- ${f} (${panels.length} panels)`);
});
console.log(index.join('\n'));
const config = {
  extends: '../../tsconfig.json',
  files: ['../../types.ts', ...files.map((_, n) => `d${n}.ts`)],
};
fs.writeFileSync(path.join(out, 'tsconfig.json'), JSON.stringify(config, null, 1));
const tsc = path.join(here, 'node_modules', 'typescript', 'bin', 'tsc');
try {
  execFileSync(process.execPath, [tsc, '-p', path.join(out, 'tsconfig.json')], { stdio: 'inherit', cwd: out });
} catch {
  console.error(`check-dashboards: tsc rejected the dashboards (see ${out})`);
  process.exit(1);
}
fs.rmSync(out, { recursive: true, force: true });
console.log(`check-dashboards: ${files.length} dashboards type-check against @grafana/schema`);
