// The dashboard's line-chart panels (Chart.js): which series each one draws.
// A panel stays hidden until one of its series has a point; series that
// appear later (a new layer, a new rank) are added to its chart as they come.
'use strict';

const PALETTE = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2',
                 '#7f7f7f', '#bcbd22', '#17becf', '#393b79', '#ad494a', '#637939', '#7b4173'];
const EVENT_COLOURS = {checkpoint: '#2ca02c', straggler: '#ff7f0e', skipped_step: '#d62728',
                       loss_spike: '#d62728', restart: '#9467bd', resume: '#9467bd',
                       error: '#d62728'};

// Numbers for axes and the header: 3 significant digits, k/M/G beyond 1e4.
function fmt(v) {
  if (typeof v !== 'number' || !isFinite(v)) return '–';
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toPrecision(3) + 'G';
  if (a >= 1e6) return (v / 1e6).toPrecision(3) + 'M';
  if (a >= 1e4) return (v / 1e3).toPrecision(3) + 'k';
  if (a !== 0 && a < 1e-3) return v.toExponential(2);
  return String(Number(v.toPrecision(4)));
}
function fmtBytes(v) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${Number(v.toPrecision(3))} ${units[i]}`;
}
const fmtPercent = (v) => `${Number((v * 100).toPrecision(3))}%`;

// Series specs: {key, label, axis?, dashed?, width?, points?: true, marker?: true}.
function one(store, key, label, extra = {}) {
  return store.get(key) ? [{key, label, ...extra}] : [];
}
function each(store, name, label, extra = {}) {
  return store.named(name).map((s) => ({key: s.key, label: label(s.labels), ...extra}));
}
const byLayer = (l) => `layer ${l.layer}`;

const LINE_PANELS = [
  {id: 'loss', title: 'Loss', series: (s) => [
    ...one(s, 'moetron_loss', 'train', {width: 2}),
    ...one(s, 'moetron_validation_loss', 'validation', {points: true, width: 2}),
    ...each(s, 'moetron_task_loss', (l) => `task ${l.task}`)]},
  {id: 'lr', title: 'Learning rate', series: (s) => one(s, 'moetron_learning_rate', 'lr')},
  {id: 'grad-norm', title: 'Gradient norm: global and per layer', logY: true, series: (s) => [
    ...one(s, 'moetron_grad_norm', 'global', {width: 2.5}),
    ...each(s, 'layer_grad_norm', byLayer)]},
  {id: 'throughput', title: 'Throughput: tokens/s and MFU', y2: fmtPercent, series: (s) => [
    ...one(s, 'moetron_tokens_per_second', 'tokens/s', {width: 2}),
    ...one(s, 'moetron_mfu_ratio', 'MFU (right)', {axis: 'y2', dashed: true})]},
  {id: 'phases', title: 'Step time by phase (seconds)', series: (s) => [
    ...one(s, 'moetron_step_seconds', 'step', {width: 2}),
    ...each(s, 'moetron_phase_seconds', (l) => l.phase)]},
  {id: 'ranks', title: 'Step time per rank (seconds), stragglers marked', series: (s) => [
    ...one(s, 'straggler_marker', 'straggler', {marker: true}),
    ...each(s, 'moetron_rank_step_seconds', (l) => `rank ${l.rank}`)]},
  {id: 'memory', title: 'Memory per allocator tag', yFormat: fmtBytes, series: (s) => [
    ...each(s, 'moetron_memory_bytes', (l) => l.tag),
    ...each(s, 'moetron_memory_peak_bytes', (l) => `${l.tag} peak`, {dashed: true})]},
  {id: 'comm-bytes', title: 'Communication per axis (bytes per step)', yFormat: fmtBytes,
   series: (s) => each(s, 'comm_bytes_per_step', (l) => l.axis)},
  {id: 'comm-seconds', title: 'Communication time per axis (seconds per step)',
   series: (s) => each(s, 'comm_seconds_per_step', (l) => l.axis)},
  {id: 'router-entropy', title: 'Router entropy per layer',
   series: (s) => each(s, 'moetron_router_entropy', byLayer)},
  {id: 'balance', title: 'Balancing losses', series: (s) => [
    ...one(s, 'moetron_aux_loss', 'aux loss'), ...one(s, 'moetron_z_loss', 'z loss')]},
  {id: 'drops', title: 'Dropped tokens', series: (s) => [
    ...one(s, 'moetron_dropped_tokens_total', 'dropped (total)'),
    ...one(s, 'dropped_slots', 'dropped slots (step)')]},
  {id: 'loss-scale', title: 'Loss scale (fp16)', logY: true,
   series: (s) => one(s, 'moetron_loss_scale', 'scale')},
  {id: 'activation-rms', title: 'Activation RMS per layer',
   series: (s) => each(s, 'moetron_activation_rms', byLayer)},
  {id: 'update-ratio', title: 'Update / parameter norm per layer and group', logY: true,
   series: (s) => each(s, 'moetron_param_update_ratio', (l) => `${l.layer} ${l.group}`)},
];

// Vertical lines at the steps of the run's events (window.moetronEvents).
const eventMarkers = {
  id: 'eventMarkers',
  afterDatasetsDraw(chart) {
    const events = window.moetronEvents || [];
    const x = chart.scales.x;
    if (!x || events.length === 0) return;
    const {top, bottom} = chart.chartArea;
    const g = chart.ctx;
    g.save();
    g.setLineDash([4, 3]);
    for (const ev of events) {
      if (typeof ev.step !== 'number' || ev.step < x.min || ev.step > x.max) continue;
      const px = x.getPixelForValue(ev.step);
      g.strokeStyle = EVENT_COLOURS[ev.kind] || '#999';
      g.beginPath();
      g.moveTo(px, top);
      g.lineTo(px, bottom);
      g.stroke();
    }
    g.restore();
  },
};

function datasetFor(spec, store, index) {
  const colour = spec.marker ? '#d62728' : PALETTE[index % PALETTE.length];
  return {
    label: spec.label,
    data: store.get(spec.key).points,  // shared: new points show at the next update
    borderColor: colour,
    backgroundColor: colour,
    borderWidth: spec.width || 1.5,
    borderDash: spec.dashed ? [6, 3] : [],
    pointRadius: spec.marker ? 6 : spec.points ? 3 : 0,
    pointStyle: spec.marker ? 'triangle' : 'circle',
    showLine: !spec.marker && !spec.points,
    yAxisID: spec.axis || 'y',
    order: spec.marker ? -1 : 0,
  };
}

function makeLineChart(canvas, panel) {
  const scales = {
    x: {type: 'linear', title: {display: true, text: 'step'}, ticks: {maxTicksLimit: 8}},
    y: {type: panel.logY ? 'logarithmic' : 'linear',
        ticks: {callback: (v) => (panel.yFormat || fmt)(v), maxTicksLimit: 6}},
  };
  if (panel.y2) {
    scales.y2 = {position: 'right', grid: {drawOnChartArea: false},
                 ticks: {callback: (v) => panel.y2(v)}};
  }
  return new Chart(canvas, {
    type: 'line',
    data: {datasets: []},
    options: {
      animation: false, parsing: false, normalized: true, spanGaps: true,
      maintainAspectRatio: false,
      interaction: {mode: 'nearest', axis: 'x', intersect: false},
      scales,
      plugins: {
        legend: {labels: {boxWidth: 10, font: {size: 10}}},
        decimation: {enabled: true, algorithm: 'lttb', samples: 800},
      },
    },
    plugins: [eventMarkers],
  });
}

// Adds the panel's new series to its chart and shows it once it has data.
function updateLinePanel(state, store) {
  const specs = state.panel.series(store);
  for (const spec of specs) {
    if (state.keys.has(spec.key)) continue;
    state.keys.add(spec.key);
    if (!state.chart) state.chart = makeLineChart(state.canvas, state.panel);
    state.chart.data.datasets.push(datasetFor(spec, store, state.keys.size - 1));
    state.chart.options.plugins.legend.display = state.keys.size <= 20;
  }
  state.section.classList.toggle('hidden', specs.length === 0);
  if (state.chart) state.chart.update('none');
}
