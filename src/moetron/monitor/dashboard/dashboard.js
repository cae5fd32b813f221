// The live dashboard: builds the panels, polls the server's history and
// events once a second (/api/history, /api/events, each from where the last
// answer stopped) and redraws what changed.
'use strict';

const POLL_MS = 1000;
const store = new SeriesStore();
window.moetronEvents = [];
const linePanels = [];
const heatmaps = new Map();  // layer -> canvas
let stepsSince = -1, eventsSince = -1, lastUpdate = null, explored = null, exploreChart = null;

function el(tag, attrs = {}, text = '') {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text) e.textContent = text;
  return e;
}

function addSection(id, title, parent) {
  const section = el('section', {id: `panel-${id}`, class: 'panel hidden'});
  section.appendChild(el('h2', {}, title));
  parent.appendChild(section);
  return section;
}

function buildPanels() {
  const main = document.getElementById('panels');
  for (const panel of LINE_PANELS) {
    const section = addSection(panel.id, panel.title, main);
    const box = el('div', {class: 'chart-box'});
    const canvas = el('canvas');
    box.appendChild(canvas);
    section.appendChild(box);
    linePanels.push({panel, section, canvas, chart: null, keys: new Set()});
    if (panel.id === 'ranks') section.appendChild(el('p', {id: 'straggler-note', class: 'note'}));
  }
  const heat = addSection('expert-load', 'Expert load per layer over time (load / mean load)', main);
  heat.classList.add('wide');
  heat.appendChild(el('div', {class: 'legend-bar'},
                      'blue: starved (1/4 of the mean)  white: balanced  red: overloaded (4x)'));
  heat.appendChild(el('div', {id: 'heatmaps'}));
  const explore = addSection('explore', 'Any series', main);
  const select = el('select', {id: 'explore-select'});
  select.onchange = () => { explored = select.value; redrawExplore(); };
  explore.appendChild(select);
  const box = el('div', {class: 'chart-box'});
  box.appendChild(el('canvas', {id: 'explore-canvas'}));
  explore.appendChild(box);
}

function updateHeatmaps() {
  // Shown first: a hidden canvas has no size to draw at.
  document.getElementById('panel-expert-load').classList.toggle('hidden', store.heat.size === 0);
  const holder = document.getElementById('heatmaps');
  for (const [layer, heat] of store.heat) {
    if (!heatmaps.has(layer)) {
      const row = el('div', {class: 'heat-row'});
      row.appendChild(el('span', {class: 'heat-label'}, `layer ${layer}`));
      const box = el('div', {class: 'heat-box'});
      const canvas = el('canvas', {class: 'heatmap', 'data-layer': layer});
      box.appendChild(canvas);
      row.appendChild(box);
      holder.appendChild(row);
      heatmaps.set(layer, canvas);
    }
    drawHeatmap(heatmaps.get(layer), heat);
  }
}

function redrawExplore() {
  if (!explored || !store.get(explored)) return;
  if (exploreChart) exploreChart.destroy();
  exploreChart = makeLineChart(document.getElementById('explore-canvas'), {});
  exploreChart.data.datasets.push(datasetFor({key: explored, label: explored}, store, 0));
  exploreChart.update('none');
}

function updateExplore() {
  const select = document.getElementById('explore-select');
  if (select.options.length !== store.series.size) {
    const keys = [...store.series.keys()].sort();
    select.replaceChildren(...keys.map((k) => el('option', {value: k}, k)));
    if (!explored) explored = store.get('moetron_loss') ? 'moetron_loss' : keys[0];
    select.value = explored;
    redrawExplore();
  } else if (exploreChart) {
    exploreChart.update('none');
  }
  document.getElementById('panel-explore').classList.toggle('hidden', store.series.size === 0);
}

function updateHeader() {
  const line = store.latest;
  if (!line) return;
  document.getElementById('latest-step').textContent = String(line.step);
  const last = (key) => {
    const s = store.get(key);
    return s && s.points.length ? s.points[s.points.length - 1].y : NaN;
  };
  document.getElementById('latest-loss').textContent = fmt(last('moetron_loss'));
  document.getElementById('latest-tps').textContent = fmt(last('moetron_tokens_per_second'));
  const n = store.stragglers.length;
  const text = n === 0 ? '' : `Straggler${n > 1 ? 's' : ''}: rank ` +
                              `${store.stragglers.join(', rank ')} (step ${line.step})`;
  const note = document.getElementById('stragglers');
  note.classList.toggle('hidden', n === 0);
  note.textContent = text;
  const sn = document.getElementById('straggler-note');
  if (sn) sn.textContent = text;
}

function updateEvents(events) {
  if (events.length === 0) return;
  window.moetronEvents.push(...events);
  const table = document.getElementById('events');
  for (const ev of events) {
    const row = el('tr', {class: `event-${ev.kind || 'other'}`});
    const time = typeof ev.time === 'number' ? new Date(ev.time * 1000).toLocaleTimeString() : '';
    for (const text of [time, ev.step ?? '', ev.kind || '', ev.message || '']) {
      row.appendChild(el('td', {}, String(text)));
    }
    table.insertBefore(row, table.firstChild);
  }
  document.getElementById('events-panel').classList.remove('hidden');
}

async function fetchPage(path, since) {
  const res = await fetch(`${path}?since=${since}`, {cache: 'no-store'});
  if (!res.ok) throw new Error(`${path}: HTTP ${res.status}`);
  const items = await res.json();
  const last = Number(res.headers.get('X-Moetron-Last'));
  return {items, next: Number.isFinite(last) ? last : since};
}

async function poll() {
  const status = document.getElementById('connection');
  try {
    const events = await fetchPage('/api/events', eventsSince);
    eventsSince = events.next;
    updateEvents(events.items);
    const steps = await fetchPage('/api/history', stepsSince);
    stepsSince = steps.next;
    for (const line of steps.items) store.addLine(line);
    if (steps.items.length > 0 || events.items.length > 0) {
      lastUpdate = new Date();
      for (const state of linePanels) updateLinePanel(state, store);
      updateHeatmaps();
      updateExplore();
      updateHeader();
    }
    status.textContent = 'live';
    status.className = 'stat live';
  } catch (err) {
    status.textContent = 'disconnected';
    status.className = 'stat down';
    console.error(err);
  }
  document.getElementById('updated').textContent =
      lastUpdate ? lastUpdate.toLocaleTimeString() : 'no data yet';
  setTimeout(poll, POLL_MS);
}

buildPanels();
poll();
