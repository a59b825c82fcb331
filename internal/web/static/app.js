// Turnstone web view: the scrubber and the timeline's filters. The pages
// work without this script; it only saves clicks. It makes no request of
// its own.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  // Scrubber: show the sequence while dragging, load the state on release.
  var scrub = document.getElementById("scrub");
  var out = document.getElementById("scrub-out");
  if (scrub && out) {
    scrub.addEventListener("input", function () { out.textContent = scrub.value; });
    scrub.addEventListener("change", function () { scrub.form.submit(); });
  }
  // Timeline filters: hide event categories, or show anomalies only.
  var filter = document.getElementById("catfilter");
  if (filter) {
    filter.hidden = false;
    var apply = function () {
      var hidden = {};
      filter.querySelectorAll("input[data-cat]").forEach(function (c) { hidden[c.dataset.cat] = !c.checked; });
      var only = document.getElementById("only-anomalies").checked;
      document.querySelectorAll("table.timeline tr.ev").forEach(function (tr) {
        var hide = hidden[tr.dataset.cat] === true || (only && !tr.classList.contains("has-anomaly"));
        tr.classList.toggle("hidden", hide);
      });
    };
    filter.addEventListener("change", apply);
  }
  // Keyboard: [ and ] step the state one event back and forth.
  document.addEventListener("keydown", function (e) {
    if (e.target && (e.target.tagName === "INPUT" || e.target.tagName === "SELECT")) { return; }
    var id = e.key === "[" ? "step-back" : e.key === "]" ? "step-forward" : "";
    var a = id && document.getElementById(id);
    if (a) { window.location.href = a.href; }
  });
});
