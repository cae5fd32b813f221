// Expert load over time, drawn by hand on a canvas: one row per expert, one
// column per step (several steps per pixel column on long runs), coloured by
// the expert's load divided by the mean load of its layer at that step, so 1
// (white) is perfect balance, red is overloaded and blue starved.
'use strict';

const HEAT_MARGIN = {left: 34, right: 8, top: 6, bottom: 18};

// r = load / mean -> an rgb colour on a log2 scale clamped to [1/4, 4].
function heatColour(r) {
  if (!(r >= 0) || !isFinite(r)) return 'rgb(200,200,200)';
  const t = Math.max(-1, Math.min(1, Math.log2(Math.max(r, 1e-9)) / 2));
  const fade = (a) => Math.round(255 - (255 - a) * Math.abs(t));
  return t >= 0 ? `rgb(${fade(200)},${fade(30)},${fade(30)})`
                : `rgb(${fade(30)},${fade(80)},${fade(200)})`;
}

// Draws heat = {experts, columns: [{step, values}]} into canvas.
function drawHeatmap(canvas, heat) {
  const ratio = window.devicePixelRatio || 1;
  const cssWidth = canvas.clientWidth || 600;
  const cssHeight = canvas.clientHeight || 160;
  canvas.width = Math.round(cssWidth * ratio);
  canvas.height = Math.round(cssHeight * ratio);
  const g = canvas.getContext('2d');
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, cssWidth, cssHeight);
  const w = cssWidth - HEAT_MARGIN.left - HEAT_MARGIN.right;
  const h = cssHeight - HEAT_MARGIN.top - HEAT_MARGIN.bottom;
  const n = heat.columns.length;
  const experts = heat.experts;
  if (n === 0 || experts === 0 || w <= 0 || h <= 0) return;
  const cols = Math.min(n, Math.floor(w));
  const cw = w / cols;
  const rh = h / experts;
  for (let c = 0; c < cols; c++) {
    const col = heat.columns[Math.floor((c * n) / cols)];
    let sum = 0, count = 0;
    for (const v of col.values) {
      if (typeof v === 'number' && isFinite(v)) { sum += v; count++; }
    }
    const mean = count > 0 ? sum / count : 0;
    for (let e = 0; e < experts; e++) {
      const v = col.values[e];
      g.fillStyle = heatColour(mean > 0 && typeof v === 'number' ? v / mean : NaN);
      g.fillRect(HEAT_MARGIN.left + c * cw, HEAT_MARGIN.top + e * rh, Math.ceil(cw), Math.ceil(rh));
    }
  }
  g.fillStyle = '#555';
  g.font = '10px sans-serif';
  g.textAlign = 'right';
  g.textBaseline = 'middle';
  const every = Math.max(1, Math.ceil(experts / Math.max(1, Math.floor(h / 12))));
  for (let e = 0; e < experts; e += every) {
    g.fillText(String(e), HEAT_MARGIN.left - 4, HEAT_MARGIN.top + (e + 0.5) * rh);
  }
  g.textBaseline = 'top';
  g.textAlign = 'left';
  g.fillText(`step ${heat.columns[0].step}`, HEAT_MARGIN.left, cssHeight - HEAT_MARGIN.bottom + 4);
  g.textAlign = 'right';
  g.fillText(`step ${heat.columns[n - 1].step}`, cssWidth - HEAT_MARGIN.right,
             cssHeight - HEAT_MARGIN.bottom + 4);
  canvas.onmousemove = (ev) => {
    const x = ev.offsetX - HEAT_MARGIN.left, y = ev.offsetY - HEAT_MARGIN.top;
    if (x < 0 || y < 0 || x >= w || y >= h) return;
    const col = heat.columns[Math.floor((Math.floor(x / cw) * n) / cols)];
    const e = Math.floor(y / rh);
    canvas.title = `step ${col.step}, expert ${e}: ${col.values[e]}`;
  };
}
