// sonde report: draws the charts as SVG from the data inlined in #sonde-data, makes the case
// tables sortable, and gives each chart its PNG and SVG export and each table its CSV, all made
// in the page (nothing is fetched). Each chart goes into an element with data-chart; when all
// are drawn the document element gets data-ready="1" (the browser tests wait for it).
// `window.sondeReport` holds the exporters, for the tests.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("sonde-data").textContent);
  var palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  var light = ["#aec7e8", "#ff9896", "#98df8a", "#ffbb78", "#c5b0d5", "#c49c94",
    "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5"];
  var color = function (i) { return palette[i % palette.length]; };
  var FONT = "system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif";
  var SIZE = 12;
  var figure = 0;

  // ---- text ---------------------------------------------------------------------------------
  var measure = document.createElement("canvas").getContext("2d");
  function textWidth(s, size, bold) {
    measure.font = (bold ? "600 " : "") + (size || SIZE) + "px " + FONT;
    return measure.measureText(String(s)).width;
  }
  // `s` cut to `max` px with an ellipsis.
  function fit(s, max, size, bold) {
    s = String(s);
    if (textWidth(s, size, bold) <= max) return s;
    var lo = 0, hi = s.length;
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (textWidth(s.slice(0, mid) + "…", size, bold) <= max) lo = mid; else hi = mid - 1;
    }
    return s.slice(0, lo) + "…";
  }
  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }
  function num(v) { return Math.round(v * 100) / 100; }
  // A text element; `o`: anchor, size, bold, fill, full (the whole text, shown on hover when cut),
  // max (width to cut at), baseline ("middle" by default), rotate.
  function text(x, y, s, o) {
    o = o || {};
    var size = o.size || SIZE;
    var shown = o.max ? fit(s, o.max, size, o.bold) : String(s);
    var full = o.full || s;
    var attrs = ' x="' + num(x) + '" y="' + num(y) + '" font-size="' + size + '"' +
      (o.anchor ? ' text-anchor="' + o.anchor + '"' : "") +
      ' dominant-baseline="' + (o.baseline || "middle") + '"' +
      (o.bold ? ' font-weight="600"' : "") +
      ' fill="' + (o.fill || "#222") + '"' +
      (o.rotate ? ' transform="rotate(' + o.rotate + " " + num(x) + " " + num(y) + ')"' : "");
    var title = shown !== String(full) ? "<title>" + esc(full) + "</title>" : "";
    return "<text" + attrs + ">" + title + esc(shown) + "</text>";
  }
  function rect(x, y, w, h, o) {
    o = o || {};
    return '<rect x="' + num(x) + '" y="' + num(y) + '" width="' + num(Math.max(0, w)) + '" height="' + num(h) + '"' +
      ' fill="' + (o.fill || "none") + '"' + (o.stroke ? ' stroke="' + o.stroke + '"' : "") +
      (o.dash ? ' stroke-dasharray="' + o.dash + '"' : "") + "/>";
  }
  function line(x1, y1, x2, y2, stroke, width, dash) {
    return '<line x1="' + num(x1) + '" y1="' + num(y1) + '" x2="' + num(x2) + '" y2="' + num(y2) +
      '" stroke="' + stroke + '" stroke-width="' + (width || 1) + '"' + (dash ? ' stroke-dasharray="' + dash + '"' : "") + "/>";
  }

  // ---- numbers ------------------------------------------------------------------------------
  function us(v) {
    if (v == null) return "";
    if (v >= 1e6) return (v / 1e6).toFixed(3) + " s";
    return v < 1000 ? v.toFixed(2) + " µs" : (v / 1000).toFixed(3) + " ms";
  }
  // A tick of the RTT axis: 10 µs, 2 ms, 1 s.
  function usTick(v) {
    var f = function (x) { return String(Number(x.toPrecision(3))); };
    if (v >= 1e6) return f(v / 1e6) + " s";
    if (v >= 1000) return f(v / 1000) + " ms";
    return f(v) + " µs";
  }
  // "p99.9" for x = 1 / (1 - p): 10 -> p90, 1000 -> p99.9.
  function pctLabel(x) {
    if (x == null) return "";
    if (x <= 1) return "min";
    var p = 100 - 100 / x;
    return "p" + p.toFixed(6).replace(/0+$/, "").replace(/\.$/, "");
  }

  // A scale from data to pixels, [a, b]; log scales cover whole decades.
  function scale(min, max, a, b, log) {
    if (log) {
      var l0 = Math.floor(Math.log10(min)), l1 = Math.ceil(Math.log10(max));
      if (l1 <= l0) l1 = l0 + 1;
      return {
        lo: Math.pow(10, l0), hi: Math.pow(10, l1), log: true,
        pos: function (v) { return a + (Math.log10(v) - l0) / (l1 - l0) * (b - a); },
        ticks: function () {
          var major = [], minor = [];
          for (var k = l0; k <= l1; k++) {
            major.push(Math.pow(10, k));
            if (k < l1) minor.push(2 * Math.pow(10, k), 5 * Math.pow(10, k));
          }
          return [major, minor];
        },
      };
    }
    if (!(max > min)) max = min + 1;
    var step = niceStep((max - min) / Math.max(2, Math.abs(b - a) / 80));
    var lo = Math.floor(min / step) * step, hi = Math.ceil(max / step) * step;
    return {
      lo: lo, hi: hi, log: false,
      pos: function (v) { return a + (v - lo) / (hi - lo) * (b - a); },
      ticks: function () {
        var t = [];
        for (var v = lo; v <= hi + step / 2; v += step) t.push(Number(v.toPrecision(12)));
        return [t, []];
      },
    };
  }
  function niceStep(raw) {
    var p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }
  // The ticks whose labels fit side by side along an axis (majors first) and, along a horizontal
  // one, inside [0, right] px: [value, label] pairs.
  function fitTicks(s, fmt, horizontal, right) {
    var both = s.ticks(), kept = [];
    var box = function (v) {
      var p = s.pos(v), half = horizontal ? textWidth(fmt(v)) / 2 + 4 : SIZE / 2 + 3;
      return [p - half, p + half];
    };
    [both[0], both[1]].forEach(function (set, minor) {
      set.forEach(function (v) {
        if (v < s.lo - 1e-12 || v > s.hi * (1 + 1e-12)) return;
        var b = box(v);
        if (horizontal && (b[0] < 0 || b[1] > right)) return;
        var clash = kept.some(function (k) { var o = box(k); return b[0] < o[1] && o[0] < b[1]; });
        // A major that clashes thins the majors; a minor is simply left out.
        if (!clash) kept.push(v);
        else if (!minor) return;
      });
    });
    kept.sort(function (x, y) { return x - y; });
    return kept.map(function (v) { return [v, fmt(v)]; });
  }

  function width(el) {
    // Not below 720 px: a narrower window (or the paper) scales the drawing down instead.
    return Math.max(720, Math.min(1200, Math.floor(el.clientWidth || 960)));
  }

  // Legend items flowed into lines: returns [svg, height].
  function legend(items, x0, y0, w) {
    var out = "", x = x0, y = y0 + 8, lineH = 18;
    items.forEach(function (it) {
      var label = fit(it.label, 420);
      var iw = 18 + textWidth(label) + 16;
      if (x > x0 && x + iw > x0 + w) { x = x0; y += lineH; }
      out += it.swatch(x, y) + text(x + 18, y, it.label, { max: 420 });
      x += iw;
    });
    return [out, y - y0 + lineH / 2 + 4];
  }
  function svgOpen(w, h, title) {
    return '<svg width="' + w + '" height="' + h + '" viewBox="0 0 ' + w + " " + h + '"' +
      ' font-family="' + esc(FONT) + '" role="img" aria-label="' + esc(title) + '">' +
      rect(0, 0, w, h, { fill: "#fff" });
  }
  function heading(el, w) {
    figure += 1;
    var title = "Figure " + figure + ". " + (el.getAttribute("data-title") || "");
    return [text(0, 12, title, { bold: true, size: 14, max: w, full: title }), 30, title];
  }

  // ---- bars: mean and p99.99 per case, grouped by the axes, horizontal ----------------------
  function barsChart(el, bars) {
    var W = width(el);
    var seriesValues = bars.series_values || [];
    var seriesIndex = function (s) { var i = seriesValues.indexOf(s); return i < 0 ? 0 : i; };
    var all = [];
    bars.panels.forEach(function (p) { p.groups.forEach(function (g) { g.bars.forEach(function (b) { all.push(b); }); }); });
    var vals = [];
    all.forEach(function (b) { [b.mean_us, b.p9999_us, b.substitute_us].forEach(function (v) { if (v > 0) vals.push(v); }); });
    var lo = vals.length ? Math.min.apply(null, vals) : 1, hi = vals.length ? Math.max.apply(null, vals) : 10;
    // The text beside each bar: the mean and the p99.99, or its stand-in (what the table shows).
    var valueText = function (b) {
      var t = b.mean_us != null ? "mean " + us(b.mean_us) : "";
      var tail = b.p9999_us != null ? "p99.99 " + us(b.p9999_us)
        : b.substitute_us != null ? (b.substitute === "max" ? "max " + us(b.substitute_us) : "p99.99 ~" + us(b.substitute_us) + " (" + b.substitute + ")")
        : "";
      return t + (t && tail ? " · " : "") + tail;
    };
    var groupW = 0, seriesW = 0, valueW = 0;
    bars.panels.forEach(function (p) {
      p.groups.forEach(function (g) {
        groupW = Math.max(groupW, textWidth(g.label, SIZE, true));
        g.bars.forEach(function (b) {
          if (b.series != null) seriesW = Math.max(seriesW, textWidth(b.series));
          valueW = Math.max(valueW, textWidth(valueText(b)));
        });
      });
    });
    groupW = Math.min(groupW, W * 0.28);
    seriesW = Math.min(seriesW, W * 0.12);
    valueW = Math.min(valueW, W * 0.36);
    var left = groupW + 12 + (seriesW ? seriesW + 10 : 0);
    var plotL = left + 4, plotR = W - valueW - 16;
    var s = scale(lo, hi, plotL, plotR, true);
    var head = heading(el, W);
    var out = head[0], y = head[1];
    // Legend: a colour per series, then what the shades mean.
    var items = seriesValues.map(function (v, i) {
      return { label: bars.series + "=" + v, swatch: function (x, y) { return rect(x, y - 6, 12, 12, { fill: color(i) }); } };
    });
    items.push({ label: "mean", swatch: function (x, y) { return rect(x, y - 3, 12, 6, { fill: "#555" }); } });
    items.push({ label: "p99.99", swatch: function (x, y) { return rect(x, y - 6, 12, 12, { fill: "#ccc" }); } });
    items.push({ label: "stand-in where the samples cannot support p99.99 (see the table)", swatch: function (x, y) { return rect(x + 0.5, y - 5.5, 11, 11, { fill: "#fff", stroke: "#555", dash: "3 2" }); } });
    var lg = legend(items, 0, y, W);
    out += lg[0];
    y += lg[1] + 6;
    var rowH = 20, gap = 8;
    var ticks = fitTicks(s, usTick, true, W);
    bars.panels.forEach(function (p) {
      if (p.title) {
        out += text(0, y + 8, p.title, { bold: true, max: W });
        y += 22;
      }
      var top = y;
      var rows = "";
      p.groups.forEach(function (g) {
        var gh = g.bars.length * rowH;
        rows += text(groupW, y + gh / 2, g.label, { anchor: "end", bold: true, max: groupW });
        g.bars.forEach(function (b, k) {
          var cy = y + k * rowH + rowH / 2, c = seriesIndex(b.series);
          var tip = b.case + ": " + valueText(b);
          rows += "<g><title>" + esc(tip) + "</title>";
          if (b.p9999_us != null) rows += rect(plotL, cy - 7, s.pos(b.p9999_us) - plotL, 14, { fill: light[c % light.length] });
          else if (b.substitute_us != null) rows += rect(plotL, cy - 6.5, s.pos(b.substitute_us) - plotL, 13, { fill: "#fff", stroke: color(c), dash: "4 3" });
          if (b.mean_us != null) rows += rect(plotL, cy - 3.5, s.pos(b.mean_us) - plotL, 7, { fill: color(c) });
          rows += "</g>";
          if (b.series != null) rows += text(groupW + 10, cy, b.series, { max: seriesW, fill: color(c) });
          rows += text(plotR + 8, cy, valueText(b), { max: valueW, full: tip });
        });
        y += gh + gap;
      });
      var bottom = y - gap + 4;
      // Grid and axis under the bars.
      var grid = "";
      ticks.forEach(function (t) { grid += line(s.pos(t[0]), top - 4, s.pos(t[0]), bottom, "#e4e4e4"); });
      out += grid + rows + line(plotL, top - 4, plotL, bottom, "#888") + line(plotL, bottom, plotR, bottom, "#888");
      ticks.forEach(function (t) { out += text(s.pos(t[0]), bottom + 14, t[1], { anchor: "middle" }); });
      y = bottom + 28;
    });
    out += text((plotL + plotR) / 2, y + 6, "RTT (log scale)", { anchor: "middle" });
    y += 20;
    el.innerHTML = svgOpen(W, y, head[2]) + out + "</svg>";
  }

  // ---- lines: the distribution and throughput over time ------------------------------------
  // spec: x (values), series [{name, key, y, color, width, points}], xlog, ylog, yzero, xfmt,
  // yfmt, xlabel, ylabel, height, tip(name, x, y); optional: xzero (the x axis from 0), xextra
  // (more x values the axis covers), gaps (a
  // null breaks a line rather than joining its neighbours; a point with no neighbour gets a
  // dot), band {name, lo, hi, color} (shaded between lo and hi, broken where either is null),
  // ydomain [lo, hi] (values the y axis covers whatever the data: one scale for charts meant to
  // be read side by side), strokes {name, x, lo, hi, color} (a vertical stroke from lo to hi at
  // each x, none where either is null).
  function lineChart(el, spec) {
    var W = width(el);
    var head = heading(el, W);
    var xs = spec.x, xmin = Infinity, xmax = -Infinity, ymin = Infinity, ymax = -Infinity;
    var xsets = [xs].concat(spec.strokes ? [spec.strokes.x] : [], spec.xextra ? [spec.xextra] : []);
    xsets.forEach(function (set) { set.forEach(function (v) { if (v != null && (!spec.xlog || v > 0)) { xmin = Math.min(xmin, v); xmax = Math.max(xmax, v); } }); });
    var ysets = spec.series.map(function (s) { return s.y; });
    if (spec.band) ysets.push(spec.band.lo, spec.band.hi);
    if (spec.strokes) ysets.push(spec.strokes.lo, spec.strokes.hi);
    if (spec.ydomain) ysets.push(spec.ydomain);
    ysets.forEach(function (set) { set.forEach(function (v) { if (v != null && (!spec.ylog || v > 0)) { ymin = Math.min(ymin, v); ymax = Math.max(ymax, v); } }); });
    if (!isFinite(xmin)) { xmin = 1; xmax = 10; }
    if (!isFinite(ymin)) { ymin = 1; ymax = 10; }
    if (spec.yzero) ymin = 0;
    if (spec.xzero) xmin = 0;
    var plotT = head[1] + 6, plotB = plotT + (spec.height || 320);
    var ys = scale(ymin, spec.yzero ? ymax * 1.05 : ymax, plotB, plotT, spec.ylog);
    var yt = fitTicks(ys, spec.yfmt, false);
    var tickW = Math.max.apply(null, yt.map(function (t) { return textWidth(t[1]); }).concat([20]));
    var plotL = tickW + 30, plotR = W - 12;
    var xsc = scale(xmin, xmax, plotL, plotR, spec.xlog);
    var xt = fitTicks(xsc, spec.xfmt, true, W);
    var out = head[0];
    yt.forEach(function (t) { out += line(plotL, ys.pos(t[0]), plotR, ys.pos(t[0]), "#e4e4e4") + text(plotL - 6, ys.pos(t[0]), t[1], { anchor: "end" }); });
    xt.forEach(function (t) { out += line(xsc.pos(t[0]), plotT, xsc.pos(t[0]), plotB, "#e4e4e4") + text(xsc.pos(t[0]), plotB + 16, t[1], { anchor: "middle" }); });
    out += line(plotL, plotT, plotL, plotB, "#888") + line(plotL, plotB, plotR, plotB, "#888");
    out += text((plotL + plotR) / 2, plotB + 36, spec.xlabel, { anchor: "middle" });
    out += text(10, (plotT + plotB) / 2, spec.ylabel, { anchor: "middle", rotate: -90 });
    var total = 0;
    spec.series.forEach(function (s) { total += s.y.length; });
    var hover = total <= 4000;
    var drawable = function (x, v) { return v != null && x != null && (!spec.ylog || v > 0) && (!spec.xlog || x > 0); };
    if (spec.band) {
      // One polygon per stretch where both edges are known: along hi, back along lo.
      var b = spec.band, polys = "", upper = [], lower = [];
      var flush = function () {
        if (upper.length) polys += '<polygon points="' + upper.concat(lower.reverse()).join(" ") + '" fill="' + b.color + '" stroke="' + b.color + '" stroke-width="1"/>';
        upper = []; lower = [];
      };
      xs.forEach(function (x, i) {
        if (!drawable(x, b.lo[i]) || !drawable(x, b.hi[i])) { flush(); return; }
        upper.push(num(xsc.pos(x)) + "," + num(ys.pos(b.hi[i])));
        lower.push(num(xsc.pos(x)) + "," + num(ys.pos(b.lo[i])));
      });
      flush();
      out += '<g data-band="' + esc(b.name) + '"><title>' + esc(b.name) + "</title>" + polys + "</g>";
    }
    if (spec.strokes) {
      var k = spec.strokes, sd = "";
      k.x.forEach(function (x, i) {
        if (!drawable(x, k.lo[i]) || !drawable(x, k.hi[i])) return;
        var px = num(xsc.pos(x)), top = ys.pos(k.hi[i]), bottom = ys.pos(k.lo[i]);
        // At least a pixel tall, so that a bin whose samples are all alike still shows.
        if (bottom - top < 1) { top -= 0.5; bottom += 0.5; }
        sd += "M" + px + " " + num(bottom) + "L" + px + " " + num(top);
      });
      out += '<g data-strokes="' + esc(k.name) + '"><title>' + esc(k.name) + '</title><path d="' + sd + '" fill="none" stroke="' + k.color + '" stroke-width="1"/></g>';
    }
    spec.series.forEach(function (s) {
      var d = "", dots = "", tips = "", broken = true;
      s.y.forEach(function (v, i) {
        var x = xs[i];
        if (!drawable(x, v)) { if (spec.gaps) broken = true; return; }
        var px = xsc.pos(x), py = ys.pos(v);
        d += (d && !broken ? "L" : "M") + num(px) + " " + num(py);
        broken = false;
        var alone = spec.gaps && !drawable(xs[i - 1], s.y[i - 1]) && !drawable(xs[i + 1], s.y[i + 1]);
        if (s.points || alone) dots += '<circle cx="' + num(px) + '" cy="' + num(py) + '" r="' + (s.points ? 3 : 2.5) + '" fill="' + s.color + '"/>';
        if (hover) tips += '<circle cx="' + num(px) + '" cy="' + num(py) + '" r="5" fill="transparent"><title>' + esc(spec.tip(s.name, x, v)) + "</title></circle>";
      });
      out += '<g' + (s.key ? ' data-series="' + esc(s.key) + '"' : "") + '><title>' + esc(s.name) + '</title><path d="' + d + '" fill="none" stroke="' + s.color + '" stroke-width="' + (s.width || 1.5) + '"/>' + dots + tips + "</g>";
    });
    var items = spec.series.map(function (s) {
      return { label: s.name, swatch: function (x, y) { return line(x, y, x + 12, y, s.color, 3) + (s.points ? '<circle cx="' + (x + 6) + '" cy="' + y + '" r="3" fill="' + s.color + '"/>' : ""); } };
    });
    if (spec.band) items.push({ label: spec.band.name, swatch: function (x, y) { return rect(x, y - 6, 12, 12, { fill: spec.band.color }); } });
    if (spec.strokes) items.push({ label: spec.strokes.name, swatch: function (x, y) { return line(x + 2, y - 6, x + 2, y + 6, spec.strokes.color) + line(x + 6, y - 3, x + 6, y + 5, spec.strokes.color) + line(x + 10, y - 6, x + 10, y + 2, spec.strokes.color); } });
    var lg = legend(items, 0, plotB + 52, W);
    out += lg[0];
    var H = plotB + 52 + lg[1] + 4;
    el.innerHTML = svgOpen(W, H, head[2]) + out + "</svg>";
  }

  function distributionChart(el, dist) {
    lineChart(el, {
      x: dist.x,
      series: dist.series.map(function (s, i) { return { name: s.name, y: s.y_us, color: color(i), width: 2, points: s.points }; }),
      xlog: true, ylog: true, height: 360,
      xfmt: pctLabel, yfmt: usTick,
      xlabel: "percentile (log scale of 1 / (1 - p))", ylabel: "RTT (log scale)",
      tip: function (name, x, y) { return name + ": " + pctLabel(x) + " " + us(y); },
    });
  }

  function throughputChart(el, t) {
    lineChart(el, {
      x: t.x_s,
      series: t.series.map(function (s, i) { var total = s.name === "total"; return { name: s.name, y: s.mbps, color: total ? "#000" : color(i), width: total ? 2.5 : 1.5 }; }),
      yzero: true, height: 260,
      xfmt: function (v) { return String(Number(v.toPrecision(6))) + " s"; },
      yfmt: function (v) { return String(Number(v.toPrecision(6))); },
      xlabel: "time (s, interval end)", ylabel: "Mbit/s",
      tip: function (name, x, y) { return name + " at " + x.toFixed(2) + " s: " + y.toFixed(2) + " Mbit/s"; },
    });
  }

  // RTT over time, one run: p50 and p99 of each interval over its min-to-max band, on the RTT
  // axis every such chart shares (`domain`: the smallest and largest RTT of them all), so that
  // the runs compare by eye. Log scale: an interval's p99 or max can be a hundred times its p50.
  function rttTimeChart(el, c, domain) {
    lineChart(el, {
      x: c.x_s,
      series: [
        { name: "p50", key: "p50", y: c.p50_us, color: palette[0], width: 2 },
        { name: "p99", key: "p99", y: c.p99_us, color: palette[1], width: 2 },
      ],
      band: { name: "interval min to max", lo: c.min_us, hi: c.max_us, color: "#e6e6e6" },
      strokes: c.log ? { name: "every sample, binned (" + us(c.log.bin_s * 1e6) + " bins): min to max", x: c.log.x_s, lo: c.log.min_us, hi: c.log.max_us, color: "#8a8a8a" } : null,
      ydomain: domain, gaps: true, ylog: true, xzero: true, xextra: [c.end_s], height: 240,
      xfmt: function (v) { return String(Number(v.toPrecision(6))) + " s"; },
      yfmt: usTick,
      xlabel: "time since the test started (s, interval middle)", ylabel: "RTT (log scale)",
      tip: function (name, x, y) {
        var i = c.x_s.indexOf(x);
        return name + " of the interval around " + x.toFixed(3) + " s: " + us(y) + (i >= 0 ? " (" + c.samples[i] + " samples)" : "");
      },
    });
  }
  function rttTimeDomain(charts) {
    var lo = Infinity, hi = -Infinity;
    charts.forEach(function (c) {
      c.min_us.forEach(function (v) { if (v != null && v > 0) lo = Math.min(lo, v); });
      c.max_us.forEach(function (v) { if (v != null && v > 0) hi = Math.max(hi, v); });
      if (c.log) {
        c.log.min_us.forEach(function (v) { if (v != null && v > 0) lo = Math.min(lo, v); });
        c.log.max_us.forEach(function (v) { if (v != null && v > 0) hi = Math.max(hi, v); });
      }
    });
    return isFinite(lo) ? [lo, hi] : [];
  }

  // ---- export -------------------------------------------------------------------------------
  function slug(s) { return String(s).toLowerCase().replace(/[^a-z0-9.]+/g, "-").replace(/^-+|-+$/g, "").slice(0, 80) || "chart"; }
  // The chart as a standalone SVG document.
  function svgText(chart) {
    var svg = chart.querySelector("svg");
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + new XMLSerializer().serializeToString(svg);
  }
  // The chart as PNG (twice its size on screen, for print and high-density screens).
  function png(chart) {
    return new Promise(function (resolve, reject) {
      var svg = chart.querySelector("svg");
      var w = Number(svg.getAttribute("width")), h = Number(svg.getAttribute("height")), k = 2;
      var img = new Image();
      img.onload = function () {
        var c = document.createElement("canvas");
        c.width = w * k; c.height = h * k;
        var g = c.getContext("2d");
        g.fillStyle = "#fff";
        g.fillRect(0, 0, c.width, c.height);
        g.drawImage(img, 0, 0, c.width, c.height);
        c.toBlob(function (b) { if (b) resolve(b); else reject(new Error("the chart could not be made a PNG")); }, "image/png");
      };
      img.onerror = function () { reject(new Error("the chart could not be drawn as an image")); };
      img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svgText(chart));
    });
  }
  // The table as CSV (RFC 4180): the header row and every row as shown, in the shown order.
  function cells(table) {
    return Array.prototype.map.call(table.querySelectorAll("tr"), function (tr) {
      return Array.prototype.map.call(tr.children, function (c) { return plain(c.textContent.trim()); });
    });
  }
  // A number with thousands separators (120,000) without them, for a spreadsheet.
  function plain(v) { return /^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$/.test(v) ? v.replace(/,/g, "") : v; }
  function csv(table) {
    return cells(table).map(function (r) {
      return r.map(function (v) { return /[",\n\r]/.test(v) ? '"' + v.replace(/"/g, '""') + '"' : v; }).join(",");
    }).join("\r\n") + "\r\n";
  }
  function tsv(table) {
    return cells(table).map(function (r) { return r.map(function (v) { return v.replace(/[\t\r\n]+/g, " "); }).join("\t"); }).join("\n") + "\n";
  }
  function download(blob, name) {
    var a = document.createElement("a");
    a.download = name;
    a.href = URL.createObjectURL(blob);
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(function () { URL.revokeObjectURL(a.href); }, 10000);
  }
  function flash(button, msg) {
    var was = button.textContent;
    button.textContent = msg;
    setTimeout(function () { button.textContent = was; }, 1500);
  }
  function tools(after, buttons) {
    var bar = document.createElement("div");
    bar.className = "tools";
    buttons.forEach(function (b) {
      var el = document.createElement("button");
      el.type = "button";
      el.textContent = b[0];
      el.title = b[1];
      el.addEventListener("click", function () {
        Promise.resolve().then(b[2]).catch(function (e) { flash(el, "failed: " + e.message); });
      });
      bar.appendChild(el);
    });
    after.parentNode.insertBefore(bar, after.nextSibling);
  }
  var canCopy = !!(navigator.clipboard && window.ClipboardItem);
  function chartTools(chart) {
    var name = slug(chart.getAttribute("data-title") || chart.getAttribute("data-chart"));
    var buttons = [
      ["PNG", "download this chart as a PNG image", function () { return png(chart).then(function (b) { download(b, name + ".png"); }); }],
      ["SVG", "download this chart as an SVG drawing", function () { download(new Blob([svgText(chart)], { type: "image/svg+xml" }), name + ".svg"); }],
    ];
    if (canCopy) {
      buttons.push(["copy PNG", "copy this chart to the clipboard as an image", function () {
        return navigator.clipboard.write([new ClipboardItem({ "image/png": png(chart) })]);
      }]);
    }
    tools(chart, buttons);
  }
  function tableTools(table) {
    var name = slug(table.getAttribute("data-table") + (table.getAttribute("data-run") ? "-run-" + table.getAttribute("data-run") : ""));
    var buttons = [["CSV", "download this table as CSV, in the order shown", function () { download(new Blob([csv(table)], { type: "text/csv" }), name + ".csv"); }]];
    if (navigator.clipboard) {
      buttons.push(["copy", "copy this table to the clipboard, tab-separated (pastes into a spreadsheet)", function () { return navigator.clipboard.writeText(tsv(table)); }]);
    }
    tools(table, buttons);
  }

  // ---- sortable tables ----------------------------------------------------------------------
  // A cell's number, in base units where the cell states its unit (the helpers' shares do:
  // 900 MiB < 1.6 GiB): 1,234.5; ~12.3 (8 beyond); max 15.6; +613.44 µs. None: text order.
  var UNITS = { "ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1, "B": 1, "KiB": 1024, "MiB": 1048576,
    "GiB": 1073741824, "TiB": 1099511627776, "bit/s": 1, "Kbit/s": 1e3, "Mbit/s": 1e6,
    "Gbit/s": 1e9, "Tbit/s": 1e12 };
  function sortValue(td) {
    var t = td.textContent.trim().replace(/,/g, "").replace(/^(max |~)/, "");
    var m = /^([+-]?\d+(?:\.\d+)?)\s*([A-Za-zµ\/]+)?/.exec(t);
    return m ? Number(m[1]) * (UNITS[m[2]] || 1) : null;
  }
  function sortable(table) {
    var body = table.tBodies[0];
    if (!body || !table.tHead) return;
    Array.prototype.forEach.call(body.rows, function (r, i) { r.setAttribute("data-order", String(i)); });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.title = "sort by this column (again: the other way; a third time: as it was)";
      th.tabIndex = 0;
      var click = function () {
        var state = th.getAttribute("aria-sort");
        var next = state === "ascending" ? "descending" : state === "descending" ? "none" : "ascending";
        Array.prototype.forEach.call(table.tHead.rows[0].cells, function (o) { o.removeAttribute("aria-sort"); });
        if (next !== "none") th.setAttribute("aria-sort", next);
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          if (next === "none") return a.getAttribute("data-order") - b.getAttribute("data-order");
          var x = sortValue(a.cells[col]), y = sortValue(b.cells[col]), d;
          if (x != null && y != null) d = x - y;
          else if (x != null) return -1; // empty and text cells last either way
          else if (y != null) return 1;
          else d = a.cells[col].textContent.localeCompare(b.cells[col].textContent);
          return next === "ascending" ? d : -d;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      };
      th.addEventListener("click", click);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); click(); } });
    });
  }

  // ---- draw ---------------------------------------------------------------------------------
  var drawn = 0;
  var rttDomain = rttTimeDomain(data.rtt_time || []);
  document.querySelectorAll("[data-chart]").forEach(function (el) {
    var kind = el.getAttribute("data-chart");
    if (kind === "latency-bars") barsChart(el, data.latency_bars);
    else if (kind === "rtt-distribution") distributionChart(el, data.distribution);
    else if (kind === "throughput") throughputChart(el, data.throughput[Number(el.getAttribute("data-index"))]);
    else if (kind === "rtt-time") rttTimeChart(el, data.rtt_time[Number(el.getAttribute("data-index"))], rttDomain);
    else throw new Error("unknown chart " + kind);
    chartTools(el);
    drawn += 1;
  });
  document.querySelectorAll("table.sortable").forEach(sortable);
  document.querySelectorAll("table[data-table]").forEach(tableTools);
  // Printing shows the host configurations folded away on screen.
  window.addEventListener("beforeprint", function () {
    document.querySelectorAll("details").forEach(function (d) { d.setAttribute("open", ""); });
  });
  window.sondeReport = { svg: svgText, png: png, csv: csv };
  document.documentElement.setAttribute("data-charts", String(drawn));
  document.documentElement.setAttribute("data-ready", "1");
})();
