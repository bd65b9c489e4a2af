// The program graph panel: pan and zoom (svg-pan-zoom, shipped in vendor/), hover tips,
// clicks sent to Python, search, and the replay of a tactic's propagation, event by event.
// Python sends the SVG, the elements to open on, the selected value's elements and the
// replay's frames; everything here is display: no decision is taken in the browser.

const READABLE = 4 / 3; // CSS px per SVG point: graphviz's 10 pt labels at 13 px, 8 pt at 11 px
const FIT_MIN = 1.2; // CSS px per point when fitting: node labels at 12 px, edge labels at 9.6
const FIT_MAX = 2; // and at most this: a small drawing is not blown up
const PAD = 12; // points kept between what is shown and the panel's edge
const PAN_STEP = 80; // px per arrow key
const TICK_MS = 120; // replay: one tick of play

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function button(label, cls, title, onClick) {
  const b = el("button", `wb-gv-button ${cls}`, label);
  b.type = "button";
  b.title = title;
  b.setAttribute("aria-label", title);
  b.addEventListener("click", (ev) => { ev.stopPropagation(); onClick(); });
  return b;
}

function render({ model, el: root }) {
  root.classList.add("wb-graphview");
  const bar = el("div", "wb-gv-bar");
  const stage = el("div", "wb-gv-stage");
  stage.tabIndex = 0;
  stage.setAttribute("role", "application");
  stage.setAttribute("aria-label",
    "program graph: drag or arrow keys to pan, wheel or + and - to zoom, 0 to fit, 1 for readable size; click a value to inspect it, a box to open it");
  const tip = el("div", "wb-gv-tip");
  tip.setAttribute("role", "tooltip");
  stage.appendChild(tip);
  const waiting = el("div", "wb-gv-wait", "drawing the program graph…");
  stage.appendChild(waiting);
  const replay = el("div", "wb-replay");
  root.append(bar, stage, replay);

  let pz = null; // the svg-pan-zoom instance
  let svg = null;

  // -- zoom ---------------------------------------------------------------------------------
  const base = () => pz.getSizes().realZoom / pz.getZoom(); // real zoom at zoom 1
  const realZoom = () => (pz ? pz.getSizes().realZoom : 1);
  const report = () => {
    root.dataset.zoom = realZoom().toFixed(4);
    zoomText.textContent = `${Math.round((100 * realZoom()) / READABLE)}%`;
  };
  const zoomBy = (f) => { if (pz) { pz.zoomBy(f); report(); } };
  const readable = () => { if (pz) { pz.zoom(READABLE / base()); report(); } };

  function center(ids, keepZoom, mode) {
    // show the elements ``ids``: fitted ("fit": as large as fits, within FIT_MIN..FIT_MAX so
    // labels stay readable), at the readable scale ("readable"), or at the zoom it has
    // (``keepZoom``). Where they do not all fit, the window holding most of them; the view
    // never leaves the drawing (no blank side where the drawing could fill it).
    // svg-pan-zoom applies a zoom on the next frame, so positions are computed from its
    // state and the elements' boxes in the drawing's own coordinates, not read off the page.
    if (!pz) return;
    const s = stage.getBoundingClientRect(), svgBox = svg.getBoundingClientRect();
    const whole = drawingBox(svg.querySelector("g.graph"));
    const found = ids.map((id) => byId(id)).filter(Boolean);
    const boxes = found.length ? targetBoxes(found) : [whole];
    let zoom = realZoom();
    if (!keepZoom) {
      zoom = mode === "readable" ? READABLE : fitZoom(union(boxes), s.width, s.height);
      pz.zoom(zoom / base());
    }
    const view = windowOn(boxes, whole, s.width / zoom, s.height / zoom);
    view.left = clearLeft(view.left);
    // screen = svg's corner + pan + zoom * drawing coordinates
    pz.pan({ x: s.left - svgBox.left - zoom * view.left, y: s.top - svgBox.top - zoom * view.top });
    root.dataset.view = [view.left, view.top, view.left + s.width / zoom, view.top + s.height / zoom]
      .map((x) => x.toFixed(1)).join(" ");
    report();
  }

  function targetBoxes(found) {
    // nodes and boxes by their outline; an edge by its label (its path may cross the drawing)
    const nodes = found.filter((e) => !e.classList.contains("edge"));
    const edges = found.filter((e) => e.classList.contains("edge"));
    const boxes = nodes.map(drawingBox);
    for (const e of edges) boxes.push(drawingBox(e.querySelector("text") || e));
    return boxes;
  }

  function windowOn(boxes, whole, w, h) {
    // the top-left corner (drawing coordinates) of a w x h window: the boxes centred if
    // they fit, else the window, anchored at one box, that holds whole the most of them;
    // then kept on the drawing (centred on it along a side where it is smaller than the window)
    const u = union(boxes);
    let left = (u.left + u.right - w) / 2, top = (u.top + u.bottom - h) / 2;
    if (u.right - u.left > w - 2 * PAD || u.bottom - u.top > h - 2 * PAD) {
      let best = -1;
      for (const a of boxes.slice(0, 400)) {
        const l = a.left - PAD, t = a.top - PAD;
        const n = boxes.filter((b) => b.left >= l && b.right <= l + w && b.top >= t && b.bottom <= t + h).length;
        if (n > best) { best = n; left = l; top = t; }
      }
    }
    const keep = (x, lo, hi, size) => (hi - lo + 2 * PAD <= size ? (lo + hi - size) / 2 : Math.max(lo - PAD, Math.min(x, hi + PAD - size)));
    return { left: keep(left, whole.left, whole.right, w), top: keep(top, whole.top, whole.bottom, h) };
  }

  function clearLeft(left) {
    // a window whose left edge runs through a node moves left until it shows that node whole
    const nodes = [...svg.querySelectorAll("g.node")].map(drawingBox);
    for (let i = 0; i < 50; i++) {
      const cut = nodes.filter((b) => b.left < left && b.right > left);
      if (!cut.length) break;
      left = Math.min(...cut.map((b) => b.left)) - PAD;
    }
    return left;
  }

  function fitZoom(box, width, height) {
    const z = Math.min((width - 2 * PAD) / Math.max(box.right - box.left, 1), (height - 2 * PAD) / Math.max(box.bottom - box.top, 1));
    return Math.max(FIT_MIN, Math.min(FIT_MAX, z));
  }

  function drawingBox(e) {
    // ``e``'s box in the coordinates svg-pan-zoom's viewport scales and pans
    const b = e.getBBox();
    const viewport = svg.querySelector(".svg-pan-zoom_viewport");
    const m = viewport.getCTM().inverse().multiply(e.getCTM());
    const a = new DOMPoint(b.x, b.y).matrixTransform(m);
    const c = new DOMPoint(b.x + b.width, b.y + b.height).matrixTransform(m);
    return { left: Math.min(a.x, c.x), top: Math.min(a.y, c.y), right: Math.max(a.x, c.x), bottom: Math.max(a.y, c.y) };
  }

  function union(boxes) {
    return boxes.reduce((u, b) => ({
      left: Math.min(u.left, b.left), top: Math.min(u.top, b.top),
      right: Math.max(u.right, b.right), bottom: Math.max(u.bottom, b.bottom),
    }));
  }

  const byId = (id) => (svg && id ? svg.querySelector(`[id="${CSS.escape(id)}"]`) : null);

  // -- the toolbar --------------------------------------------------------------------------
  const zoomText = el("span", "wb-gv-zoom", "100%");
  const search = el("input", "wb-graph-search");
  search.type = "search";
  search.placeholder = "find a value by name (enter)";
  search.setAttribute("aria-label", "find a value by name");
  search.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") model.send({ event: "search", text: search.value });
  });
  bar.append(
    button("−", "wb-zoom-out", "zoom out (-)", () => zoomBy(1 / 1.25)),
    button("+", "wb-zoom-in", "zoom in (+)", () => zoomBy(1.25)),
    button("fit", "wb-fit", "fit the whole graph (0)", () => { pz && (pz.fit(), pz.center(), report()); }),
    button("1:1", "wb-readable", "readable size, on what the last step changed (1)", () => center(model.get("focus").ids || [], false, "readable")),
    zoomText,
    button("⤢", "wb-full-width", "full width (f)", () => {
      const wb = root.closest(".wb-workbench") || root;
      wb.classList.toggle("wb-graph-full");
      setTimeout(() => { pz && (pz.resize(), focus()); }, 50);
    }),
    search,
  );

  // -- hover, click, keyboard ---------------------------------------------------------------
  const target = (node) => node && node.closest && node.closest("g.node, g.edge, g.cluster");
  let down = null;
  stage.addEventListener("mousedown", (ev) => { down = [ev.clientX, ev.clientY]; });
  stage.addEventListener("click", (ev) => {
    const moved = down && Math.hypot(ev.clientX - down[0], ev.clientY - down[1]) > 4;
    down = null;
    if (moved) return;
    const t = target(ev.target);
    if (t && t.id) model.send({ event: "click", id: t.id });
    stage.focus({ preventScroll: true });
  });
  stage.addEventListener("mouseover", (ev) => {
    const t = target(ev.target);
    const text = t && (t.dataset.tip || "");
    if (!text) { tip.style.display = "none"; return; }
    tip.textContent = text;
    tip.style.display = "block";
  });
  stage.addEventListener("mousemove", (ev) => {
    if (tip.style.display !== "block") return;
    const r = stage.getBoundingClientRect();
    const x = Math.min(ev.clientX - r.left + 14, r.width - tip.offsetWidth - 4);
    tip.style.left = `${Math.max(0, x)}px`;
    tip.style.top = `${ev.clientY - r.top + 14}px`;
  });
  stage.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  stage.addEventListener("keydown", (ev) => {
    const keys = {
      "+": () => zoomBy(1.25), "=": () => zoomBy(1.25), "-": () => zoomBy(1 / 1.25),
      "0": () => { pz.fit(); pz.center(); report(); }, "1": () => center(model.get("focus").ids || [], false, "readable"),
      ArrowLeft: () => pz.panBy({ x: PAN_STEP, y: 0 }), ArrowRight: () => pz.panBy({ x: -PAN_STEP, y: 0 }),
      ArrowUp: () => pz.panBy({ x: 0, y: PAN_STEP }), ArrowDown: () => pz.panBy({ x: 0, y: -PAN_STEP }),
      " ": () => togglePlay(), ",": () => go(step - 1), ".": () => go(step + 1),
      Escape: () => replay.querySelector(".wb-replay-exit").click(),
      f: () => bar.querySelector(".wb-full-width").click(),
      n: () => cursorBy(1), p: () => cursorBy(-1),
      Enter: () => { if (cursor) model.send({ event: "click", id: cursor.id }); },
    };
    if (pz && keys[ev.key]) { ev.preventDefault(); keys[ev.key](); }
  });

  // the keyboard's pointer: n / p walk the values, ops and boxes, Enter clicks, the tip shows
  let cursor = null;
  function cursorBy(d) {
    const all = [...svg.querySelectorAll("g.node, g.edge, g.cluster.wb-foldable")].filter((e) => e.id);
    if (!all.length) return;
    const i = cursor ? all.indexOf(cursor) : -1;
    cursor?.classList.remove("wb-cursor");
    cursor = all[(i + d + all.length) % all.length];
    cursor.classList.add("wb-cursor");
    tip.textContent = cursor.dataset.tip || cursor.textContent.trim();
    tip.style.display = "block";
    tip.style.left = "8px";
    tip.style.top = "8px";
    follow([cursor.id]);
  }

  // -- drawing ------------------------------------------------------------------------------
  let drawStart = 0;
  function draw() {
    drawStart = performance.now();
    cursor = null;
    if (pz) { pz.destroy(); pz = null; }
    if (svg) svg.remove();
    const holder = document.createElement("div");
    holder.innerHTML = model.get("svg");
    svg = holder.querySelector("svg");
    waiting.style.display = svg ? "none" : "";
    if (!svg) { start(); return; }
    svg.removeAttribute("width");
    svg.removeAttribute("height");
    svg.style.width = "100%";
    svg.style.height = "100%";
    // the tooltips graphviz wrote as link titles: shown at once, by the panel
    for (const a of svg.querySelectorAll("a")) {
      const title = a.getAttribute("xlink:title") || a.getAttribute("title");
      const owner = target(a);
      if (title && owner && !owner.dataset.tip) owner.dataset.tip = title;
      a.removeAttribute("xlink:title");
      a.removeAttributeNS("http://www.w3.org/1999/xlink", "title");
    }
    for (const t of svg.querySelectorAll("title")) t.remove();
    const folds = model.get("folds") || {};
    for (const id of Object.keys(folds)) byId(id)?.classList.add("wb-foldable");
    stage.insertBefore(svg, tip);
    start();
  }

  let shown = false;
  function start() {
    // svg-pan-zoom measures the panel: wait until it is on the page with a size
    if (!stage.isConnected || stage.clientWidth === 0 || stage.clientHeight === 0) return;
    if (!shown) {
      // once the page has painted the widget, the kernel draws what the opening held back
      shown = true;
      requestAnimationFrame(() => requestAnimationFrame(() => model.send({ event: "shown" })));
    }
    if (pz || !svg) return;
    pz = svgPanZoom(svg, {
      zoomEnabled: true, panEnabled: true, controlIconsEnabled: false, fit: false, center: false,
      minZoom: 0.01, maxZoom: 50, zoomScaleSensitivity: 0.25, dblClickZoomEnabled: false,
      onZoom: () => report(),
    });
    // zoom limits relative to a readable size: from a thumbnail to eight times readable
    pz.setMinZoom(0.02 / base());
    pz.setMaxZoom((8 * READABLE) / base());
    focus();
    select();
    if (frames !== model.get("frames")) resetReplay(); else placeReplay();
    root.dataset.drawMs = (performance.now() - drawStart).toFixed(1); // for the benchmark
    root.dataset.draws = String(Number(root.dataset.draws || 0) + 1);
  }

  function focus() {
    const f = model.get("focus") || {};
    center(f.ids || [], !!f.keep_zoom, f.mode || "fit");
  }

  function select() {
    if (!svg) return;
    for (const e of svg.querySelectorAll(".wb-selected")) e.classList.remove("wb-selected");
    for (const id of model.get("selected") || []) byId(id)?.classList.add("wb-selected");
  }

  // -- the replay ---------------------------------------------------------------------------
  let frames = [], step = 0, timer = null, active = false;
  let firstLit = new Map(), valueCount = new Map(), conflictsUpTo = [];
  const rbar = el("div", "wb-replay-bar");
  const playButton = button("play", "wb-replay-play", "play / pause (space)", () => togglePlay());
  const slider = el("input", "wb-replay-slider");
  slider.type = "range"; slider.min = "0"; slider.value = "0";
  slider.setAttribute("aria-label", "propagation event");
  slider.addEventListener("input", () => go(Number(slider.value)));
  const count = el("span", "wb-replay-count");
  const text = el("div", "wb-replay-text");
  const title = el("span", "wb-replay-title");
  rbar.append(
    title,
    button("|◀", "wb-replay-start", "before the first event", () => go(0)),
    button("◀", "wb-replay-back", "one event back (,)", () => go(step - 1)),
    playButton,
    button("▶", "wb-replay-forward", "one event forward (.)", () => go(step + 1)),
    button("▶▶|", "wb-replay-end", "after the last event", () => go(frames.length)),
    slider, count,
    button("✕", "wb-replay-exit", "leave the replay: the graph as drawn (escape)", () => {
      stop(); active = false; step = frames.length; paint(true);
    }),
  );
  replay.append(rbar, text);

  let where = {};
  const lights = (f) => (f ? [...(where[`v${f.vid}`] || []), ...(where[`o${f.oid}`] || [])] : []);

  function placeReplay() {
    // where the events land in this drawing (it changes with every redraw; the events do not)
    where = model.get("where") || {};
    firstLit = new Map();
    frames.forEach((f, i) => {
      for (const id of lights(f)) if (!firstLit.has(id)) firstLit.set(id, i + 1);
    });
    paint(true);
  }

  function resetReplay() {
    stop();
    frames = model.get("frames") || [];
    where = model.get("where") || {};
    title.textContent = model.get("replay_title") || "";
    slider.max = String(frames.length);
    firstLit = new Map(); conflictsUpTo = [0];
    frames.forEach((f, i) => {
      for (const id of lights(f)) if (!firstLit.has(id)) firstLit.set(id, i + 1);
      conflictsUpTo.push(conflictsUpTo[i] + (f.conflict ? 1 : 0));
    });
    replay.style.display = frames.length ? "" : "none";
    step = frames.length; // the tactic's end state, as drawn
    active = false;
    paint(true);
  }

  function clear() {
    for (const e of svg.querySelectorAll(".wb-lit, .wb-current")) e.classList.remove("wb-lit", "wb-current");
    svg.querySelector(".wb-replay-badge")?.remove();
  }

  function paint(all) {
    // the graph as drawn until the replay is used; then what events 1..step reached
    if (!svg) return;
    stage.classList.toggle("wb-replaying", active);
    if (!active) {
      clear();
      slider.value = String(frames.length);
      root.dataset.replayStep = String(frames.length);
      count.textContent = `${frames.length} events · ${conflictsUpTo[frames.length] || 0} conflicts`;
      text.textContent = frames.length ? "the tactic's propagation: press play, or step through it" : "";
      text.style.color = "";
      return;
    }
    if (all) {
      for (const e of svg.querySelectorAll(".wb-lit, .wb-current")) e.classList.remove("wb-lit", "wb-current");
      valueCount = new Map();
      for (let i = 0; i < step; i++) light(frames[i], i);
    }
    for (const e of svg.querySelectorAll(".wb-current")) e.classList.remove("wb-current");
    const f = frames[step - 1];
    for (const id of lights(f)) byId(id)?.classList.add("wb-current");
    badge(f);
    slider.value = String(step);
    root.dataset.replayStep = String(step);
    const changed = [...valueCount.values()].filter((n) => n > 0).length;
    const conflicts = conflictsUpTo[step] || 0;
    count.textContent = `event ${step} of ${frames.length} · ${changed} value${changed === 1 ? "" : "s"} changed`
      + (conflicts ? ` · ${conflicts} conflict${conflicts === 1 ? "" : "s"}` : "");
    text.textContent = f ? `${f.index}. ${f.text}` : (frames.length ? "before the tactic: press ▶ or step forward" : "");
    text.style.color = f && f.conflict ? "#C00000" : "";
    if (f && !all) follow(lights(f));
  }

  function badge(f) {
    // the current event's number, by the first element it lit
    svg.querySelector(".wb-replay-badge")?.remove();
    const e = f && lights(f).map(byId).find(Boolean);
    if (!e) return;
    const b = e.getBBox();
    const ns = "http://www.w3.org/2000/svg";
    const g = document.createElementNS(ns, "g");
    g.setAttribute("class", "wb-replay-badge");
    const label = String(f.index);
    const w = 10 + 7 * label.length;
    const rect = document.createElementNS(ns, "rect");
    Object.entries({ x: b.x + b.width / 2 - w / 2, y: b.y - 18, width: w, height: 16, rx: 8, fill: f.color })
      .forEach(([k, v]) => rect.setAttribute(k, v));
    const t = document.createElementNS(ns, "text");
    Object.entries({ x: b.x + b.width / 2, y: b.y - 6, "text-anchor": "middle", fill: "white",
      "font-size": "11", "font-family": "Helvetica,sans-serif", "font-weight": "bold" })
      .forEach(([k, v]) => t.setAttribute(k, v));
    t.textContent = label;
    g.append(rect, t);
    e.parentNode.appendChild(g);
  }

  function light(f, i) {
    for (const id of lights(f)) {
      const e = byId(id);
      if (!e) continue;
      e.classList.add("wb-lit");
      e.style.setProperty("--wb-lit", f.color);
    }
    if (f.value) valueCount.set(f.value, (valueCount.get(f.value) || 0) + 1);
  }

  function unlight(f, i) {
    for (const id of lights(f)) {
      if (firstLit.get(id) === i + 1) byId(id)?.classList.remove("wb-lit");
    }
    if (f.value) valueCount.set(f.value, (valueCount.get(f.value) || 1) - 1);
  }

  function go(k) {
    k = Math.max(0, Math.min(frames.length, k));
    if (!active) { active = true; step = k; paint(true); return; }
    if (Math.abs(k - step) > 64) { step = k; paint(true); return; }
    while (step < k) { light(frames[step], step); step++; }
    while (step > k) { step--; unlight(frames[step], step); }
    paint(false);
  }

  function follow(ids) {
    // keep the current event in view when stepping by hand
    if (timer !== null) return;
    const found = ids.map(byId).filter(Boolean);
    if (!found.length) return;
    const r = found[0].getBoundingClientRect(), s = stage.getBoundingClientRect();
    if (r.right < s.left || r.left > s.right || r.bottom < s.top || r.top > s.bottom) {
      pz.panBy({ x: s.left + s.width / 2 - (r.left + r.width / 2), y: s.top + s.height / 2 - (r.top + r.height / 2) });
    }
  }

  function stop() {
    if (timer !== null) { clearInterval(timer); timer = null; }
    playButton.textContent = "play";
  }

  function togglePlay() {
    if (timer !== null) { stop(); paint(false); return; }
    if (!active) { active = true; step = frames.length; paint(true); }
    if (step >= frames.length) go(0);
    const stride = Math.max(1, Math.ceil(frames.length / 250));
    playButton.textContent = "pause";
    timer = setInterval(() => {
      if (step >= frames.length) { stop(); paint(false); return; }
      go(step + stride);
    }, TICK_MS);
    paint(false);
  }

  model.on("change:svg", draw);
  model.on("change:focus", () => pz && focus());
  model.on("change:selected", select);
  model.on("change:frames", resetReplay);
  model.on("change:where", placeReplay);
  const resize = new ResizeObserver(() => {
    if (pz) { pz.resize(); focus(); } else start(); // a new size: fitted again
  });
  resize.observe(stage);
  draw();
  return () => { stop(); resize.disconnect(); if (pz) pz.destroy(); };
}

export default { render };
