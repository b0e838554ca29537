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
  var ctx = canvas.getContext('2d');
  var GUTTER = 150, AXIS = 26, LANE = 26, PAD = 6;
  var cache = {};
  var tl = null, v0 = 0, v1 = 1, width = 0, height = 0;
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

  function rows() { return tl ? tl.lanes.length + 1 : 1; }  /* row 0: exposed communication */

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

  function fmtTick(t, step) {  /* axis labels: one unit per axis, only the decimals the step needs */
    var unit = step >= 1e6 ? 1e6 : step >= 1e3 ? 1e3 : 1, name = unit === 1e6 ? ' s' : unit === 1e3 ? ' ms' : ' µs';
    var digits = Math.max(0, Math.min(3, -Math.floor(Math.log10(step / unit) + 1e-9)));
    return (t / unit).toFixed(digits) + name;
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
      ctx.fillStyle = r === 0 ? config.exposedColor : '#42526b';
      var label = r === 0 ? 'exposed comm' : tl.lanes[r - 1].label + (tl.lanes[r - 1].kind ? '  ' + tl.lanes[r - 1].kind : '');
      ctx.fillText(label.length > 24 ? label.slice(0, 23) + '…' : label, 8, y + LANE / 2);
    }
    /* axis */
    var step = niceStep(v1 - v0, Math.max(2, plotW / 110));
    ctx.strokeStyle = '#e6ebf2';
    ctx.fillStyle = '#66758a';
    ctx.textAlign = 'center';
    for (var t = Math.ceil(v0 / step) * step; t <= v1; t += step) {
      var x = xOf(t);
      ctx.beginPath(); ctx.moveTo(x + 0.5, AXIS - 4); ctx.lineTo(x + 0.5, height); ctx.stroke();
      if (x >= GUTTER - 1 && x < width - 28) ctx.fillText(fmtTick(t, step), x, AXIS / 2);
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
      ctx.fillRect(x0, AXIS + LANE, w, height - AXIS - LANE);
    }
    /* kernels; sub-pixel kernels of one colour in the same pixel column are drawn once */
    for (var l = 0; l < tl.lanes.length; l++) {
      var lane = tl.lanes[l], y0 = AXIS + (l + 1) * LANE + 4, h = LANE - 8;
      var j = firstIndex(lane.s, v0 - lane.maxd), lastPx = -1, lastC = -1;
      for (; j < lane.s.length && lane.s[j] <= v1; j++) {
        var s = lane.s[j], e = s + lane.d[j];
        if (e < v0) continue;
        var px = xOf(s), pw = xOf(e) - px;
        if (pw < 1) {
          var col = Math.floor(px);
          if (col === lastPx && lane.c[j] === lastC) continue;
          lastPx = col; lastC = lane.c[j]; pw = 1;
        }
        ctx.fillStyle = config.classColors[tl.classes[lane.c[j]]] || '#9aa5b1';
        ctx.fillRect(px, y0, pw, h);
        if (pw > 3) { ctx.fillStyle = 'rgba(255,255,255,0.35)'; ctx.fillRect(px + pw - 1, y0, 1, h); }
      }
    }
    ctx.restore();
  }

  function setRank(rank) {
    tl = load(rank);
    if (!tl) return;
    v0 = 0; v1 = Math.max(tl.end, 1);
    var msg = 'rank ' + tl.rank + (tl.step !== null ? ' · step ' + tl.step : '') + ' · ' +
      tl.n.toLocaleString() + ' kernels · span ' + fmtUs(tl.end);
    if (tl.omitted) msg += ' · ' + tl.omitted.toLocaleString() + ' short kernels not shown (size cap)';
    info.textContent = msg;
    if (select && select.value !== String(rank)) select.value = String(rank);
    tip.hidden = true;
    resize();
  }

  function zoom(factor, atX) {
    if (!tl) return;
    var c = atX === undefined ? (v0 + v1) / 2 : tOf(atX);
    var span = Math.min(Math.max((v1 - v0) * factor, 0.05), tl.end * 1.5 + 1);
    var k = (c - v0) / (v1 - v0);
    v0 = c - k * span; v1 = v0 + span;
    draw();
  }

  function hit(mx, my) {
    var row = Math.floor((my - AXIS) / LANE);
    if (!tl || row < 0 || row >= rows() || mx < GUTTER) return null;
    var t = tOf(mx), tol = (v1 - v0) / (width - GUTTER) * 2;
    if (row === 0) {
      for (var i = 0; i < tl.exposed.length; i += 2) {
        if (tl.exposed[i] - tol <= t && t <= tl.exposed[i + 1] + tol) {
          return {name: 'exposed communication', cls: 'no compute beside it', s: tl.exposed[i], d: tl.exposed[i + 1] - tl.exposed[i]};
        }
      }
      return null;
    }
    var lane = tl.lanes[row - 1];
    var j = firstIndex(lane.s, t + tol) - 1, best = null;
    for (var n = 0; j >= 0 && n < 4000 && lane.s[j] >= t - lane.maxd - tol; j--, n++) {
      if (lane.s[j] - tol <= t && t <= lane.s[j] + lane.d[j] + tol) {
        if (!best || lane.d[j] < best.d) best = {name: lane.n[j] >= 0 ? tl.names[lane.n[j]] : '(unnamed)',
          cls: config.classLabels[tl.classes[lane.c[j]]] || tl.classes[lane.c[j]], s: lane.s[j], d: lane.d[j]};
      }
    }
    return best;
  }

  function showTip(ev) {
    var rect = canvas.getBoundingClientRect();
    var mx = ev.clientX - rect.left, my = ev.clientY - rect.top;
    var h = hit(mx, my);
    if (!h) { tip.hidden = true; return; }
    tip.replaceChildren(el('div', 'tt-name', h.name),
      el('div', 'tt-meta', h.cls + ' · start ' + fmtUs(h.s) + ' · duration ' + fmtUs(h.d)));
    tip.hidden = false;
    var left = Math.min(mx + 14, width - tip.offsetWidth - 4);
    tip.style.left = Math.max(left, 4) + 'px';
    tip.style.top = (my + 16) + 'px';
  }

  canvas.addEventListener('wheel', function (ev) {
    ev.preventDefault();
    tip.hidden = true;
    zoom(ev.deltaY < 0 ? 1 / 1.25 : 1.25, ev.clientX - canvas.getBoundingClientRect().left);
  }, {passive: false});
  canvas.addEventListener('mousedown', function (ev) {
    drag = {x: ev.clientX, v0: v0, v1: v1};
    canvas.classList.add('dragging');
  });
  window.addEventListener('mouseup', function () { drag = null; canvas.classList.remove('dragging'); });
  window.addEventListener('mousemove', function (ev) {
    if (!drag) return;
    var dt = (ev.clientX - drag.x) / (width - GUTTER - PAD) * (drag.v1 - drag.v0);
    v0 = drag.v0 - dt; v1 = drag.v1 - dt;
    draw();
  });
  canvas.addEventListener('mousemove', function (ev) { if (!drag) showTip(ev); });
  canvas.addEventListener('mouseleave', function () { tip.hidden = true; });
  canvas.addEventListener('dblclick', function (ev) { zoom(1 / 2, ev.clientX - canvas.getBoundingClientRect().left); });
  document.getElementById('oc-zoom-in').addEventListener('click', function () { zoom(1 / 1.6); });
  document.getElementById('oc-zoom-out').addEventListener('click', function () { zoom(1.6); });
  document.getElementById('oc-zoom-reset').addEventListener('click', function () { if (tl) { v0 = 0; v1 = Math.max(tl.end, 1); draw(); } });
  document.addEventListener('keydown', function (ev) {
    if (ev.target && /INPUT|SELECT|TEXTAREA/.test(ev.target.tagName)) return;
    if (ev.key === '+' || ev.key === '=') zoom(1 / 1.6);
    else if (ev.key === '-') zoom(1.6);
    else if (ev.key === '0' && tl) { v0 = 0; v1 = Math.max(tl.end, 1); draw(); }
  });
  select.addEventListener('change', function () { setRank(select.value); });
  document.querySelectorAll('button[data-rank]').forEach(function (b) {
    b.addEventListener('click', function () {
      setRank(b.getAttribute('data-rank'));
      document.getElementById('timeline').scrollIntoView();
    });
  });
  window.addEventListener('resize', resize);
  if (config.initialRank !== null && config.initialRank !== undefined) setRank(config.initialRank);
})();
