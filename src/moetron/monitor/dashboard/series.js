// The dashboard's data: every step line published by the run (the objects of
// metrics.jsonl) folded into time series keyed by their Prometheus series
// key, plus a few series derived per step (per-layer gradient norms,
// communication per step, expert load per layer). Points are {x: step, y}.
'use strict';

// 'name{a="x",b="y"}' -> {name, labels: {a: 'x', b: 'y'}}; escapes \\ \" \n.
function parseSeriesKey(key) {
  const brace = key.indexOf('{');
  if (brace < 0) return {name: key, labels: {}};
  const labels = {};
  let i = brace + 1;
  while (i < key.length && key[i] !== '}') {
    const eq = key.indexOf('=', i);
    const label = key.slice(i, eq);
    let j = eq + 2;  // past ="
    let value = '';
    while (j < key.length && key[j] !== '"') {
      if (key[j] === '\\' && j + 1 < key.length) {
        const c = key[j + 1];
        value += c === 'n' ? '\n' : c;
        j += 2;
      } else {
        value += key[j++];
      }
    }
    labels[label] = value;
    i = j + 1;
    if (key[i] === ',') i++;
  }
  return {name: key.slice(0, brace), labels};
}

// Top-level metrics.jsonl keys and the registry series they duplicate: the
// registry's is used when a run has both.
const TOP_LEVEL_ALIASES = {
  loss: 'moetron_loss',
  val_loss: 'moetron_validation_loss',
  lr: 'moetron_learning_rate',
  grad_norm: 'moetron_grad_norm',
  tokens_per_s: 'moetron_tokens_per_second',
  mfu: 'moetron_mfu_ratio',
  aux_loss: 'moetron_aux_loss',
  z_loss: 'moetron_z_loss',
  loss_scale: 'moetron_loss_scale',
  step_s: 'moetron_step_seconds',
};

class SeriesStore {
  constructor() {
    this.series = new Map();  // key -> {key, name, labels, points: [{x, y}]}
    this.byName = new Map();  // name -> [series], in order of appearance
    this.heat = new Map();    // MoE layer -> {experts, columns: [{step, values}]}
    this.latest = null;       // the newest line
    this.lines = 0;
    this.stragglers = [];     // ranks named stragglers in the newest line
    this.prevCounters = null; // previous line's counter sums, for per-step rates
  }

  get(key) { return this.series.get(key); }
  named(name) { return this.byName.get(name) || []; }
  has(name) { return this.named(name).length > 0; }

  push(key, step, value, parsed) {
    if (typeof value !== 'number' || !isFinite(value)) return;
    let s = this.series.get(key);
    if (!s) {
      const p = parsed || parseSeriesKey(key);
      s = {key, name: p.name, labels: p.labels, points: []};
      this.series.set(key, s);
      if (!this.byName.has(p.name)) this.byName.set(p.name, []);
      this.byName.get(p.name).push(s);
    }
    s.points.push({x: step, y: value});
  }

  addLine(line) {
    if (typeof line.step !== 'number') return;
    const step = line.step;
    const series = line.series || {};
    for (const [top, alias] of Object.entries(TOP_LEVEL_ALIASES)) {
      if (!(alias in series) && typeof line[top] === 'number') this.push(alias, step, line[top]);
    }
    if (typeof line.skipped === 'boolean') this.push('skipped', step, line.skipped ? 1 : 0);
    if (typeof line.dropped_slots === 'number') this.push('dropped_slots', step, line.dropped_slots);
    const parsed = {};
    for (const [key, value] of Object.entries(series)) {
      parsed[key] = parseSeriesKey(key);
      if (key === 'moetron_validation_loss' && !this.isNewValidation(line, value)) continue;
      this.push(key, step, value, parsed[key]);
    }
    this.deriveLayerGradNorms(step, series, parsed);
    this.deriveCommRates(step, series, parsed);
    this.deriveExpertLoad(step, line, series, parsed);
    this.markStragglers(step, series, parsed);
    this.latest = line;
    this.lines++;
  }

  // The registry keeps the last validation loss between evaluations: a point
  // only where an evaluation ran (the line's val_loss) or the value changed.
  isNewValidation(line, value) {
    if (typeof line.val_loss === 'number') return true;
    const s = this.get('moetron_validation_loss');
    return !s || s.points[s.points.length - 1].y !== value;
  }

  // Ranks named stragglers in this line (moetron_straggler{rank} = 1): kept
  // for the banner, and a marker at their step time for the per-rank chart.
  markStragglers(step, series, parsed) {
    this.stragglers = [];
    for (const [key, value] of Object.entries(series)) {
      if (parsed[key].name !== 'moetron_straggler' || !(value >= 1)) continue;
      const rank = parsed[key].labels.rank;
      this.stragglers.push(rank);
      const t = series[`moetron_rank_step_seconds{rank="${rank}"}`];
      if (typeof t === 'number') this.push('straggler_marker', step, t);
    }
  }

  // sqrt of the sum of squares over a layer's matrix groups: one norm per layer.
  deriveLayerGradNorms(step, series, parsed) {
    const sq = new Map();
    for (const [key, value] of Object.entries(series)) {
      if (parsed[key].name !== 'moetron_param_grad_norm' || typeof value !== 'number') continue;
      const layer = parsed[key].labels.layer || '?';
      sq.set(layer, (sq.get(layer) || 0) + value * value);
    }
    for (const [layer, s] of sq) {
      this.push(`layer_grad_norm{layer="${layer}"}`, step, Math.sqrt(s));
    }
  }

  // Counters summed over operations per axis, differenced between lines and
  // divided by the steps between them.
  deriveCommRates(step, series, parsed) {
    const sums = new Map();
    for (const [key, value] of Object.entries(series)) {
      const name = parsed[key].name;
      if (name !== 'moetron_comm_bytes_total' && name !== 'moetron_comm_seconds_total') continue;
      const k = `${name}|${parsed[key].labels.axis || '?'}`;
      sums.set(k, (sums.get(k) || 0) + value);
    }
    const prev = this.prevCounters;
    if (prev && step > prev.step) {
      for (const [k, v] of sums) {
        if (!prev.sums.has(k)) continue;
        const [name, axis] = k.split('|');
        const derived = name === 'moetron_comm_bytes_total' ? 'comm_bytes_per_step'
                                                             : 'comm_seconds_per_step';
        const rate = (v - prev.sums.get(k)) / (step - prev.step);
        if (rate >= 0) this.push(`${derived}{axis="${axis}"}`, step, rate);
      }
    }
    if (sums.size > 0) this.prevCounters = {step, sums};
  }

  // Expert load per MoE layer: moetron_expert_load_ratio{layer,expert}, else
  // the top-level expert_load (per layer, per expert: counts or fractions).
  deriveExpertLoad(step, line, series, parsed) {
    const perLayer = new Map();
    for (const [key, value] of Object.entries(series)) {
      if (parsed[key].name !== 'moetron_expert_load_ratio') continue;
      const {layer, expert} = parsed[key].labels;
      if (!perLayer.has(layer)) perLayer.set(layer, []);
      perLayer.get(layer)[Number(expert)] = value;
    }
    if (perLayer.size === 0 && Array.isArray(line.expert_load)) {
      line.expert_load.forEach((loads, layer) => {
        if (Array.isArray(loads)) perLayer.set(String(layer), loads.slice());
      });
    }
    for (const [layer, values] of perLayer) {
      if (!this.heat.has(layer)) this.heat.set(layer, {experts: 0, columns: []});
      const h = this.heat.get(layer);
      h.experts = Math.max(h.experts, values.length);
      h.columns.push({step, values});
    }
  }
}
