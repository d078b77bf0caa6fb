// sonde report: draws the charts from the data inlined in #sonde-data with uPlot (inlined
// above). Each chart goes into an element with data-chart; when all are drawn the document
// element gets data-ready="1" (the browser test waits for it).
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("sonde-data").textContent);
  var palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  var color = function (i) { return palette[i % palette.length]; };

  function width(el) {
    return Math.max(480, Math.min(1200, el.clientWidth || 960));
  }

  function us(v) {
    if (v == null) return "n/a";
    return v < 1000 ? v.toFixed(2) + " µs" : (v / 1000).toFixed(3) + " ms";
  }

  // "p99.9" for x = 1 / (1 - p): 10 -> p90, 1000 -> p99.9.
  function pctLabel(x) {
    if (x == null) return "";
    if (x <= 1) return "min";
    var p = 100 - 100 / x;
    var s = p.toFixed(6).replace(/0+$/, "").replace(/\.$/, "");
    return "p" + s;
  }

  function barsChart(el, bars) {
    var n = bars.cases.length;
    var xs = bars.cases.map(function (_, i) { return i; });
    var barPaths = function (align) {
      return uPlot.paths.bars({ size: [0.35, 80], align: align, gap: 2 });
    };
    var opts = {
      width: width(el),
      height: 360,
      // RTTs of different paths differ by orders of magnitude: a log scale keeps each visible.
      scales: { x: { time: false, range: [-0.6, n - 0.4] }, y: { distr: 3 } },
      axes: [
        {
          values: function (u, vals) {
            return vals.map(function (v) { return Number.isInteger(v) && bars.cases[v] != null ? bars.cases[v] : ""; });
          },
          splits: function () { return xs; },
          size: 50,
        },
        { label: "RTT (µs, log scale)", size: 70 },
      ],
      series: [
        { label: "case", value: function (u, v) { return v == null ? "" : bars.cases[v]; } },
        { label: "mean", fill: color(0), stroke: color(0), paths: barPaths(-1), points: { show: false }, value: function (u, v) { return us(v); } },
        { label: "p99.99", fill: color(1), stroke: color(1), paths: barPaths(1), points: { show: false }, value: function (u, v) { return us(v); } },
        { label: "stand-in where p99.99 is n/a (see the table)", fill: "#f4b6b6", stroke: color(1), dash: [4, 4], paths: barPaths(1), points: { show: false }, value: function (u, v) { return us(v); } },
      ],
    };
    return new uPlot(opts, [xs, bars.mean_us, bars.p9999_us, bars.substitute_us], el);
  }

  function distributionChart(el, dist) {
    var series = [{ label: "percentile", value: function (u, v) { return v == null ? "" : pctLabel(v); } }];
    var ys = [dist.x];
    dist.series.forEach(function (s, i) {
      series.push({ label: s.name, stroke: color(i), width: 2, spanGaps: true, points: { show: s.points }, value: function (u, v) { return us(v); } });
      ys.push(s.y_us);
    });
    var opts = {
      width: width(el),
      height: 420,
      scales: { x: { time: false, distr: 3 }, y: { distr: 3 } },
      axes: [
        { label: "percentile (log scale of 1 / (1 - p))", values: function (u, vals) { return vals.map(pctLabel); }, size: 50 },
        { label: "RTT (µs, log scale)", size: 70 },
      ],
      series: series,
    };
    return new uPlot(opts, ys, el);
  }

  function throughputChart(el, t) {
    var series = [{ label: "s", value: function (u, v) { return v == null ? "" : v.toFixed(1) + " s"; } }];
    var ys = [t.x_s];
    t.series.forEach(function (s, i) {
      var total = s.name === "total";
      series.push({ label: s.name, stroke: total ? "#000" : color(i), width: total ? 2.5 : 1.5, value: function (u, v) { return v == null ? "" : v.toFixed(2) + " Mbit/s"; } });
      ys.push(s.mbps);
    });
    var opts = {
      width: width(el),
      height: 300,
      scales: { x: { time: false }, y: { range: function (u, min, max) { return [0, max * 1.1]; } } },
      axes: [{ label: "time (s, interval end)" }, { label: "Mbit/s", size: 70 }],
      series: series,
    };
    return new uPlot(opts, ys, el);
  }

  var drawn = 0;
  document.querySelectorAll("[data-chart]").forEach(function (el) {
    var kind = el.getAttribute("data-chart");
    if (kind === "latency-bars") barsChart(el, data.latency_bars);
    else if (kind === "rtt-distribution") distributionChart(el, data.distribution);
    else if (kind === "throughput") throughputChart(el, data.throughput[Number(el.getAttribute("data-index"))]);
    else throw new Error("unknown chart " + kind);
    drawn += 1;
  });
  document.documentElement.setAttribute("data-charts", String(drawn));
  document.documentElement.setAttribute("data-ready", "1");
})();
