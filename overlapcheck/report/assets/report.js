/* overlapcheck report: table sorting, copy buttons and the canvas timeline. No dependencies.
   Data comes from <script type="application/json"> blocks; every string from a trace is shown with
   textContent or drawn on the canvas, never parsed as HTML. */
(function () {
  'use strict';

  var config = JSON.parse(document.getElementById('oc-config').textContent);

  function fmtUs(us) {
    var a = Math.abs(us);
    if (a >= 1e6) return (us / 1e6).toFixed(2) + ' s';
    if (a >= 1e3) return (us / 1e3).toFixed(a >= 1e5 ? 1 : 2) + ' ms';
    if (a >= 10) return us.toFixed(0) + ' µs';
    return us.toFixed(2) + ' µs';
  }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  /* ---------- sortable tables ---------- */
  function initSorting(table) {
    var heads = table.querySelectorAll('th');
    heads.forEach(function (th, col) {
      if (!th.hasAttribute('data-type')) return;
      th.addEventListener('click', function () {
        var asc = !th.classList.contains('sorted-asc');
        heads.forEach(function (h) { h.classList.remove('sorted-asc', 'sorted-desc'); });
        th.classList.add(asc ? 'sorted-asc' : 'sorted-desc');
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = a.cells[col].getAttribute('data-v'), y = b.cells[col].getAttribute('data-v');
          var xn = x === '' || x === null ? NaN : parseFloat(x), yn = y === '' || y === null ? NaN : parseFloat(y);
          if (isNaN(xn) && isNaN(yn)) return 0;
          if (isNaN(xn)) return 1;  /* n/a always last */
          if (isNaN(yn)) return -1;
          return asc ? xn - yn : yn - xn;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  }
  document.querySelectorAll('table.sortable').forEach(initSorting);

  /* ---------- copy buttons ---------- */
  function selectText(node) {
    var range = document.createRange();
    range.selectNodeContents(node);
    var sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
  }
  function copyFallback(node) {
    selectText(node);
    var ok = false;
    try { ok = document.execCommand('copy'); } catch (e) { ok = false; }
    return ok;
  }
  document.querySelectorAll('button.copy').forEach(function (btn) {
    btn.addEventListener('click', function () {
      var node = document.getElementById(btn.getAttribute('data-target'));
      if (!node) return;
      var text = node.textContent;
      var done = function (ok) {
        btn.textContent = ok ? 'copied' : 'press Ctrl+C';
        btn.classList.toggle('done', ok);
        if (!ok) selectText(node);
        setTimeout(function () { btn.textContent = 'copy'; btn.classList.remove('done'); }, 1800);
      };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(function () { done(true); },
          function () { done(copyFallback(node)); });
      } else {
        done(copyFallback(node));
      }
    });
  });

  /* ---------- timeline ---------- */
  var canvas = document.getElementById('oc-tl-canvas');
  if (!canvas) return;
  var wrap = document.getElementById('oc-tl-wrap');
  var tip = document.getElementById('oc-tooltip');
  var info = document.getElementById('oc-tl-info');
  var select = document.getElementById('oc-tl-rank');
  var stepSelect = document.getElementById('oc-tl-step');
  var ctx = canvas.getContext('2d');
  var GUTTER = 150, AXIS = 26, LANE = 26, PAD = 6;
  var cache = {};
  var tl = null, step = null, v0 = 0, v1 = 1, width = 0, height = 0;
  var drag = null;

  function load(rank) {
    if (cache[rank]) return cache[rank];
    var blocks = document.querySelectorAll('script.oc-timeline');
    for (var i = 0; i < blocks.length; i++) {
      if (blocks[i].getAttribute('data-rank') === String(rank)) {
        cache[rank] = JSON.parse(blocks[i].textContent);
        return cache[rank];
      }
    }
    return null;
  }

  function hasHost() { return !!(tl && tl.host && tl.host.s.length); }
  /* row 0: exposed communication; rows 1..lanes: GPU lanes; then the host lane when there are blamed events */
  function rows() { return tl ? tl.lanes.length + 1 + (hasHost() ? 1 : 0) : 1; }
  function hostRow() { return tl.lanes.length + 1; }

  function resize() {
    var dpr = window.devicePixelRatio || 1;
    width = Math.max(wrap.clientWidth, 300);
    height = AXIS + rows() * LANE + PAD;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    canvas.style.height = height + 'px';
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    draw();
  }

  function xOf(t) { return GUTTER + (t - v0) / (v1 - v0) * (width - GUTTER - PAD); }
  function tOf(x) { return v0 + (x - GUTTER) / (width - GUTTER - PAD) * (v1 - v0); }

  function fmtTick(t, stepUs) {  /* axis labels: one unit per axis, only the decimals the step needs */
    var unit = stepUs >= 1e6 ? 1e6 : stepUs >= 1e3 ? 1e3 : 1, name = unit === 1e6 ? ' s' : unit === 1e3 ? ' ms' : ' µs';
    var digits = Math.max(0, Math.min(3, -Math.floor(Math.log10(stepUs / unit) + 1e-9)));
    return (t / unit).toFixed(digits) + name;
  }

  function fmtBytes(b) {
    if (b >= 1 << 30) return (b / (1 << 30)).toFixed(2) + ' GiB';
    if (b >= 1 << 20) return (b / (1 << 20)).toFixed(1) + ' MiB';
    if (b >= 1 << 10) return (b / (1 << 10)).toFixed(1) + ' KiB';
    return b + ' B';
  }

  function niceStep(span, n) {
    var raw = span / n, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
  }

  function firstIndex(starts, t) {  /* first index with starts[i] >= t */
    var lo = 0, hi = starts.length;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (starts[mid] < t) lo = mid + 1; else hi = mid; }
    return lo;
  }

  function origin() { return step ? step.start : 0; }  /* times are shown relative to the selected step */

  function draw() {
    ctx.clearRect(0, 0, width, height);
    ctx.font = '11px system-ui, sans-serif';
    ctx.textBaseline = 'middle';
    if (!tl) return;
    var plotW = width - GUTTER - PAD;
    /* lane backgrounds and labels */
    for (var r = 0; r < rows(); r++) {
      var y = AXIS + r * LANE;
      ctx.fillStyle = r % 2 ? '#ffffff' : '#f7f9fc';
      ctx.fillRect(0, y, width, LANE);
      var label;
      if (r === 0) { ctx.fillStyle = config.exposedColor; label = 'exposed comm'; }
      else if (hasHost() && r === hostRow()) { ctx.fillStyle = '#7d3c98'; label = 'host (blamed)'; }
      else { ctx.fillStyle = '#42526b'; label = tl.lanes[r - 1].label + (tl.lanes[r - 1].kind ? '  ' + tl.lanes[r - 1].kind : ''); }
      ctx.fillText(label.length > 24 ? label.slice(0, 23) + '…' : label, 8, y + LANE / 2);
    }
    ctx.save();
    ctx.beginPath(); ctx.rect(GUTTER, 0, plotW, height); ctx.clip();
    /* phase bands: a strip under the axis labels and a light tint over the lanes; step boundaries */
    var steps = tl.steps || [];
    for (var si = 0; si < steps.length; si++) {
      var st = steps[si];
      if (st.end < v0 || st.start > v1) continue;
      for (var p = 0; p < st.phases.length; p++) {
        var ph = st.phases[p], px0 = xOf(ph[1]), pw0 = Math.max(xOf(ph[2]) - px0, 1);
        ctx.fillStyle = config.phaseColors[ph[0]] || '#eeeeee';
        ctx.fillRect(px0, AXIS - 7, pw0, 6);
        ctx.globalAlpha = 0.35;
        ctx.fillRect(px0, AXIS + LANE, pw0, tl.lanes.length * LANE);
        ctx.globalAlpha = 1;
      }
      ctx.strokeStyle = '#8a97aa';
      var sx = xOf(st.start);
      ctx.beginPath(); ctx.moveTo(sx + 0.5, AXIS - 8); ctx.lineTo(sx + 0.5, height); ctx.stroke();
    }
    ctx.restore();
    /* axis */
    var tick = niceStep(v1 - v0, Math.max(2, plotW / 110)), o = origin();
    ctx.strokeStyle = '#e6ebf2';
    ctx.fillStyle = '#66758a';
    ctx.textAlign = 'center';
    for (var t = Math.ceil((v0 - o) / tick) * tick; t + o <= v1; t += tick) {
      var x = xOf(t + o);
      ctx.beginPath(); ctx.moveTo(x + 0.5, AXIS - 1); ctx.lineTo(x + 0.5, height); ctx.stroke();
      if (x >= GUTTER - 1 && x < width - 28) ctx.fillText(fmtTick(t, tick), x, AXIS / 2 - 3);
    }
    ctx.textAlign = 'left';
    ctx.save();
    ctx.beginPath(); ctx.rect(GUTTER, 0, plotW, height); ctx.clip();
    /* exposed intervals: row 0 plus a translucent band over the communication lanes */
    var ex = tl.exposed;
    for (var i = 0; i < ex.length; i += 2) {
      if (ex[i + 1] < v0 || ex[i] > v1) continue;
      var x0 = xOf(ex[i]), w = Math.max(xOf(ex[i + 1]) - x0, 1);
      ctx.fillStyle = config.exposedColor;
      ctx.fillRect(x0, AXIS + 4, w, LANE - 8);
      ctx.fillStyle = 'rgba(224, 62, 62, 0.10)';
      ctx.fillRect(x0, AXIS + LANE, w, tl.lanes.length * LANE);
    }
    /* kernels; sub-pixel kernels of one colour in the same pixel column are drawn once */
    for (var l = 0; l < tl.lanes.length; l++) {
      var lane = tl.lanes[l], y0 = AXIS + (l + 1) * LANE + 4, h = LANE - 8;
      var j = firstIndex(lane.s, v0 - lane.maxd), lastPx = -1, lastC = -1;
      for (; j < lane.s.length && lane.s[j] <= v1; j++) {
        var s = lane.s[j], e = s + lane.d[j];
        if (e < v0) continue;
        var kx = xOf(s), kw = xOf(e) - kx;
        if (kw < 1) {
          var col = Math.floor(kx);
          if (col === lastPx && lane.c[j] === lastC) continue;
          lastPx = col; lastC = lane.c[j]; kw = 1;
        }
        ctx.fillStyle = config.classColors[tl.classes[lane.c[j]]] || '#9aa5b1';
        ctx.globalAlpha = highlight === null || servesHighlight(lane, j) ? 1 : 0.15;
        ctx.fillRect(kx, y0, kw, h);
        ctx.globalAlpha = 1;
        if (kw > 3) { ctx.fillStyle = 'rgba(255,255,255,0.35)'; ctx.fillRect(kx + kw - 1, y0, 1, h); }
      }
    }
    /* host lane: the blamed syncs, waits and late launches (at least 2 px wide, so that each can be hovered) */
    if (hasHost()) {
      var H = tl.host, hy = AXIS + hostRow() * LANE + 4;
      for (var k = 0; k < H.s.length; k++) {
        if (H.s[k] + H.d[k] < v0 || H.s[k] > v1) continue;
        var hx = xOf(H.s[k]), hw = Math.max(xOf(H.s[k] + H.d[k]) - hx, 2);
        ctx.fillStyle = config.hostColors[H.k[k]] || '#7d3c98';
        ctx.fillRect(hx, hy, hw, LANE - 8);
      }
    }
    ctx.restore();
  }

  function stepWindow() {  /* a step opens on its period (docs/metrics.md), its GPU window without one */
    if (step) {
      var lo = step.period ? step.period[0] : step.start, hi = step.period ? step.period[1] : step.end;
      var pad = (hi - lo) * 0.01; v0 = lo - pad; v1 = hi + pad;
    }
    else { v0 = 0; v1 = Math.max(tl.end, 1); }
    if (v1 <= v0) v1 = v0 + 1;
  }

  function showInfo() {
    var number = step ? step.step : tl.step;
    var msg = 'rank ' + tl.rank + (number !== null && number !== undefined ? ' · step ' + number : '') + ' · ' +
      tl.n.toLocaleString() + ' kernels' + ((tl.steps || []).length > 1 ? ' over ' + tl.steps.length + ' steps' : '') +
      (step && step.period ? ' · period ' + fmtUs(step.period[1] - step.period[0]) +
        ' (from the end of the previous step\'s GPU work to the end of its own; its GPU work spans ' +
        fmtUs(step.end - step.start) + ')' : ' · span ' + fmtUs(step ? step.end - step.start : tl.end));
    if (hasHost()) msg += ' · ' + tl.host.s.length.toLocaleString() + ' blamed host events';
    if (tl.omitted) msg += ' · ' + tl.omitted.toLocaleString() + ' short kernels not shown (size cap)';
    info.textContent = msg;
  }

  function setStep(number) {
    step = null;
    var steps = tl.steps || [];
    for (var i = 0; i < steps.length; i++) if (String(steps[i].step) === String(number)) step = steps[i];
    if (!step && steps.length) step = steps[0];
    if (stepSelect && step) stepSelect.value = String(step.step);
    stepWindow();
    showInfo();
    tip.hidden = true;
    draw();
  }

  function setRank(rank, number) {
    var next = load(rank);
    if (!next) return;
    tl = next;
    if (select && select.value !== String(rank)) select.value = String(rank);
    if (stepSelect) {
      stepSelect.replaceChildren();
      (tl.steps || []).forEach(function (st) {
        var opt = el('option', null, String(st.step) + (st.step === tl.step ? ' (most exposed)' : ''));
        opt.value = String(st.step);
        stepSelect.appendChild(opt);
      });
      stepSelect.disabled = !(tl.steps || []).length;
    }
    resize();
    setStep(number !== undefined && number !== null ? number : tl.step);
  }

  function zoom(factor, atX) {
    if (!tl) return;
    var c = atX === undefined ? (v0 + v1) / 2 : tOf(atX);
    var span = Math.min(Math.max((v1 - v0) * factor, 0.05), tl.end * 1.5 + 1);
    var k = (c - v0) / (v1 - v0);
    v0 = c - k * span; v1 = v0 + span;
    draw();
  }

  var highlight = null;  /* a module path from the module table: its collectives drawn, the rest faded */
  function servesHighlight(lane, j) {
    if (!lane.m || lane.m[j] < 0 || !tl.modules) return false;
    var names = tl.modules[lane.m[j]].split('; ');
    for (var i = 0; i < names.length; i++) {
      var n = names[i];
      if (n === highlight || n.indexOf(highlight + '.') === 0) return true;
    }
    return false;
  }

  function stepOf(t) {
    var steps = tl.steps || [];
    for (var i = 0; i < steps.length; i++) if (steps[i].start <= t && t < steps[i].end) return steps[i];
    return null;
  }

  function startText(s) {
    var st = stepOf(s);
    return st ? 'start ' + fmtUs(s - st.start) + ' into step ' + st.step : 'start ' + fmtUs(s);
  }

  function hit(mx, my) {
    if (!tl || mx < GUTTER) return null;
    var t = tOf(mx), tol = (v1 - v0) / (width - GUTTER) * 2;
    if (my >= AXIS - 8 && my < AXIS) {  /* the phase strip */
      var st = stepOf(t);
      if (!st) return null;
      for (var p = 0; p < st.phases.length; p++) {
        var ph = st.phases[p];
        if (ph[1] - tol <= t && t <= ph[2] + tol) return {name: ph[0] + ' phase of step ' + st.step, meta: 'GPU span of the work it issued · ' + startText(ph[1]) + ' · duration ' + fmtUs(ph[2] - ph[1])};
      }
      return null;
    }
    var row = Math.floor((my - AXIS) / LANE);
    if (row < 0 || row >= rows()) return null;
    if (row === 0) {
      for (var i = 0; i < tl.exposed.length; i += 2) {
        if (tl.exposed[i] - tol <= t && t <= tl.exposed[i + 1] + tol) {
          return {name: 'exposed communication', meta: 'no compute beside it · ' + startText(tl.exposed[i]) + ' · duration ' + fmtUs(tl.exposed[i + 1] - tl.exposed[i])};
        }
      }
      return null;
    }
    if (hasHost() && row === hostRow()) {
      var H = tl.host, best = -1, htol = tol * 2;
      for (var k = 0; k < H.s.length; k++) {
        if (H.s[k] - htol <= t && t <= H.s[k] + H.d[k] + htol && (best < 0 || H.d[k] < H.d[best])) best = k;
      }
      if (best < 0) return null;
      return {name: H.call[best], meta: H.k[best] + ' · ' + startText(H.s[best]) + ' · duration ' + fmtUs(H.d[best]) +
        (H.cost[best] !== null ? ' · cost ' + fmtUs(H.cost[best]) : ''),
        more: (H.f[best] >= 0 ? 'finding ' + (H.f[best] + 1) + ': ' : '') + H.title[best] + (H.f[best] >= 0 ? ' (click to open)' : ''),
        finding: H.f[best]};
    }
    var lane = tl.lanes[row - 1];
    var j = firstIndex(lane.s, t + tol) - 1, found = -1;
    for (var n = 0; j >= 0 && n < 4000 && lane.s[j] >= t - lane.maxd - tol; j--, n++) {
      if (lane.s[j] - tol <= t && t <= lane.s[j] + lane.d[j] + tol && (found < 0 || lane.d[j] < lane.d[found])) found = j;
    }
    if (found < 0) return null;
    var cls = config.classLabels[tl.classes[lane.c[found]]] || tl.classes[lane.c[found]];
    var meta = cls + ' · duration ' + fmtUs(lane.d[found]) + ' · ' + startText(lane.s[found]) +
      (lane.stream !== null && lane.stream !== undefined ? ' · stream ' + lane.stream : '');
    var size = [];
    if (lane.b && lane.b[found] >= 0) size.push(fmtBytes(lane.b[found]));
    if (lane.e && lane.e[found] >= 0) size.push(lane.e[found].toLocaleString() + ' elements');
    var more = [];
    if (size.length) more.push('size ' + size.join(', '));
    if (lane.m && lane.m[found] >= 0 && tl.modules) more.push('module ' + tl.modules[lane.m[found]]);
    return {name: lane.n[found] >= 0 ? tl.names[lane.n[found]] : '(unnamed)', meta: meta,
      more: more.length ? more.join(' · ') : undefined};
  }

  function showTip(ev) {
    var rect = canvas.getBoundingClientRect();
    var mx = ev.clientX - rect.left, my = ev.clientY - rect.top;
    var h = hit(mx, my);
    canvas.style.cursor = h && h.finding !== undefined && h.finding >= 0 ? 'pointer' : '';
    if (!h) { tip.hidden = true; return; }
    var parts = [el('div', 'tt-name', h.name), el('div', 'tt-meta', h.meta)];
    if (h.more) parts.push(el('div', 'tt-meta', h.more));
    tip.replaceChildren.apply(tip, parts);
    tip.hidden = false;
    var left = Math.min(mx + 14, width - tip.offsetWidth - 4);
    tip.style.left = Math.max(left, 4) + 'px';
    var below = my + 16;
    tip.style.top = (below + tip.offsetHeight > height ? Math.max(my - tip.offsetHeight - 8, 0) : below) + 'px';
  }

  canvas.addEventListener('wheel', function (ev) {
    ev.preventDefault();
    tip.hidden = true;
    zoom(ev.deltaY < 0 ? 1 / 1.25 : 1.25, ev.clientX - canvas.getBoundingClientRect().left);
  }, {passive: false});
  canvas.addEventListener('mousedown', function (ev) {
    drag = {x: ev.clientX, v0: v0, v1: v1, moved: false};
    canvas.classList.add('dragging');
  });
  window.addEventListener('mouseup', function () { canvas.classList.remove('dragging'); setTimeout(function () { drag = null; }, 0); });
  window.addEventListener('mousemove', function (ev) {
    if (!drag || !canvas.classList.contains('dragging')) return;
    if (Math.abs(ev.clientX - drag.x) > 2) drag.moved = true;
    var dt = (ev.clientX - drag.x) / (width - GUTTER - PAD) * (drag.v1 - drag.v0);
    v0 = drag.v0 - dt; v1 = drag.v1 - dt;
    draw();
  });
  canvas.addEventListener('click', function (ev) {
    if (drag && drag.moved) return;
    var rect = canvas.getBoundingClientRect();
    var h = hit(ev.clientX - rect.left, ev.clientY - rect.top);
    if (h && h.finding !== undefined && h.finding >= 0) {
      var target = document.getElementById('finding-' + h.finding);
      if (target) {
        var folded = target.closest('details.folded');
        if (folded) folded.open = true;
        location.hash = '#finding-' + h.finding; target.scrollIntoView();
      }
    }
  });
  canvas.addEventListener('mousemove', function (ev) { if (!drag || !canvas.classList.contains('dragging')) showTip(ev); });
  canvas.addEventListener('mouseleave', function () { tip.hidden = true; });
  canvas.addEventListener('dblclick', function (ev) { zoom(1 / 2, ev.clientX - canvas.getBoundingClientRect().left); });
  document.getElementById('oc-zoom-in').addEventListener('click', function () { zoom(1 / 1.6); });
  document.getElementById('oc-zoom-out').addEventListener('click', function () { zoom(1.6); });
  document.getElementById('oc-zoom-reset').addEventListener('click', function () { if (tl) { stepWindow(); draw(); } });
  document.addEventListener('keydown', function (ev) {
    if (ev.target && /INPUT|SELECT|TEXTAREA/.test(ev.target.tagName)) return;
    if (ev.key === '+' || ev.key === '=') zoom(1 / 1.6);
    else if (ev.key === '-') zoom(1.6);
    else if (ev.key === '0' && tl) { stepWindow(); draw(); }
  });
  select.addEventListener('change', function () { setRank(select.value); });
  if (stepSelect) stepSelect.addEventListener('change', function () { if (tl) setStep(stepSelect.value); });
  document.querySelectorAll('button[data-rank]').forEach(function (b) {
    b.addEventListener('click', function () {
      setRank(b.getAttribute('data-rank'), b.getAttribute('data-step'));
      document.getElementById('timeline').scrollIntoView();
    });
  });
  document.querySelectorAll('button[data-module]').forEach(function (b) {
    b.addEventListener('click', function (ev) {
      ev.preventDefault();  /* inside a <summary>: do not fold the module */
      var path = b.getAttribute('data-module');
      highlight = highlight === path ? null : path;
      document.querySelectorAll('button[data-module]').forEach(function (o) {
        o.classList.toggle('active', o.getAttribute('data-module') === highlight);
      });
      draw();
      if (highlight !== null) document.getElementById('timeline').scrollIntoView();
    });
  });
  window.addEventListener('resize', resize);
  if (config.initialRank !== null && config.initialRank !== undefined) setRank(config.initialRank);
})();
