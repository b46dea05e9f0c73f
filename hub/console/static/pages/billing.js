// Billing: usage and cost this period (a bar per product), usage over time (a chart per product and
// day: devices, tunnel minutes and bytes, relayed bytes, registry fallback), the registry fallback's
// daily series per fleet, the prices in force and the paid features (telemetry switchable here by a
// billing admin).
import { api } from '../api.js';
import { fill, h, badge, notice } from '../dom.js';
import { bytes, number, quantity } from '../format.js';

const SVG = 'http://www.w3.org/2000/svg';

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

// A bar chart as SVG built with DOM calls (no library, no inline style): [{label, value, text}]
export function barChart(points, title) {
  const width = 640, height = 180, pad = 24;
  const max = Math.max(1, ...points.map((p) => p.value));
  const step = (width - pad * 2) / Math.max(points.length, 1);
  const chart = svg('svg', { viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': title, class: 'chart' }, svg('title', {}, title));
  points.forEach((p, i) => {
    const hgt = ((height - pad * 2) * p.value) / max;
    chart.append(svg('rect', { x: pad + i * step + 2, y: height - pad - hgt, width: Math.max(step - 4, 1), height: hgt, class: 'bar' },
      svg('title', {}, `${p.label}: ${p.text ?? p.value}`)));
  });
  chart.append(svg('line', { x1: pad, y1: height - pad, x2: width - pad, y2: height - pad, class: 'axis' }));
  if (points.length) {
    chart.append(svg('text', { x: pad, y: height - 6, class: 'tick' }, points[0].label));
    chart.append(svg('text', { x: width - pad, y: height - 6, class: 'tick end' }, points[points.length - 1].label));
  }
  return chart;
}

export async function render(main) {
  const usage = h('section', { class: 'card', id: 'usage' }, h('h2', {}, 'Usage this period'));
  const overTime = h('section', { class: 'card', id: 'usage-daily' }, h('h2', {}, 'Usage over time'));
  const fallback = h('section', { class: 'card', id: 'registry-fallback' }, h('h2', {}, 'Registry fallback'));
  const pricing = h('section', { class: 'card', id: 'pricing' }, h('h2', {}, 'Pricing'));
  const features = h('section', { class: 'card', id: 'features' }, h('h2', {}, 'Features'));
  fill(main, h('div', { class: 'title' }, h('h1', {}, 'Billing')), usage, overTime, fallback, pricing, features);
  const fail = (el) => (err) => el.append(h('p', { class: 'muted' }, err.status === 403 ? 'This needs the billing viewer relation.' : err.message));

  api('GET', '/v1/billing/usage').then(({ data: u }) => {
    const money = (v) => (v === null || v === undefined ? 'not priced' : `${v.toFixed(2)} ${u.currency}`);
    // one axis for every product: what each cost (bytes, minutes and device-days have no common scale)
    usage.append(h('p', {}, `${u.from} to ${u.to} · total ${money(u.total)}${u.locked ? ' · account locked' : ''}`),
      barChart(u.products.filter((p) => p.cost !== null).map((p) => ({ label: p.product, value: p.cost, text: money(p.cost) })), 'Cost per product'),
      h('div', { class: 'scroll' }, h('table', { id: 'usage-table' }, h('thead', {}, h('tr', {}, ['Product', 'Used', 'Billed', 'Cost'].map((t) => h('th', {}, t)))),
        h('tbody', {}, u.products.map((p) => h('tr', { dataset: { product: p.product } }, h('td', {}, p.product),
          h('td', { class: 'used' }, quantity(p.quantity, p.quantity_unit)),
          h('td', { class: 'billed' }, quantity(p.billed_quantity, p.unit)), h('td', {}, money(p.cost))))))));
  }).catch(fail(usage));
  api('GET', '/console/api/usage-daily').then(({ data: d }) => {
    overTime.append(h('p', { class: 'muted' }, `${d.from} to ${d.to}, per day`));
    for (const series of d.series) {
      const fmt = (v) => (series.unit === 'bytes' ? bytes(v) : `${number(v)} ${series.unit}`);
      overTime.append(h('figure', { class: 'series', 'data-product': series.product },
        h('figcaption', {}, `${series.description} · ${fmt(series.total)} in all`),
        barChart(d.days.map((day, i) => ({ label: day, value: series.values[i], text: fmt(series.values[i]) })),
          `${series.description} per day`)));
    }
  }).catch(fail(overTime));
  api('GET', '/v1/billing/registry-fallback').then(({ data: r }) => {
    fallback.append(barChart((r.daily || []).map((d) => ({ label: d.day, value: d.bytes, text: bytes(d.bytes) })), 'Registry fallback bytes per day'));
  }).catch(fail(fallback));
  api('GET', '/v1/billing/pricing').then(({ data: p }) => {
    pricing.append(h('p', {}, `Plan ${p.plan}${p.enterprise ? ' (enterprise)' : ''} · prices as of ${p.as_of}`),
      h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {}, ['Product', 'Unit', 'Price', 'Since'].map((t) => h('th', {}, t)))),
        h('tbody', {}, p.products.map((x) => h('tr', {}, h('td', {}, x.product), h('td', {}, x.unit), h('td', {}, x.unit_price === null || x.unit_price === undefined ? 'not set' : `${number(x.unit_price)} ${p.currency} per ${x.unit}`), h('td', {}, x.effective_from || '')))))));
  }).catch(fail(pricing));

  const msg = h('div', { 'aria-live': 'polite' });
  async function loadFeatures() {
    const f = (await api('GET', '/v1/billing/features')).data;
    fill(features, h('h2', {}, 'Features'), h('ul', {}, Object.entries(f).map(([key, v]) => h('li', {}, badge(v.enabled ? 'on' : 'off', v.enabled ? 'ok' : 'off'), ` ${key} `,
      v.self_serve ? h('button', { type: 'button', class: 'secondary', onclick: async () => {
        try { await api('PUT', `/v1/billing/features/${key}`, { enabled: !v.enabled }); await loadFeatures(); } catch (err) { notice(msg, err.message, 'error'); }
      } }, v.enabled ? 'Switch off' : 'Switch on') : h('small', { class: 'muted' }, 'enterprise'))), msg));
  }
  loadFeatures().catch(fail(features));
}
