// The run viewer's filters: show the episodes whose family, level and outcome match the three selects.
"use strict";
(function () {
  const names = ["family", "level", "outcome"];
  const selects = names.map((n) => document.getElementById("filter-" + n));
  const shown = document.getElementById("shown");
  if (selects.some((s) => !s)) return;
  function apply() {
    const wanted = selects.map((s) => s.value);
    let count = 0;
    const episodes = document.querySelectorAll("details.episode");
    episodes.forEach((el) => {
      const ok = names.every((n, i) => !wanted[i] || el.dataset[n] === wanted[i]);
      el.hidden = !ok;
      if (ok) count += 1;
    });
    shown.textContent = count + " of " + episodes.length + " episodes shown";
  }
  selects.forEach((s) => s.addEventListener("change", apply));
  apply();
})();
