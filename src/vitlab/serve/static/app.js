// The page of `vitlab serve`: send images to /predict, show the top-k classes as bars and
// the attention over the image as a heat map. Plain browser JavaScript, no libraries, so the
// page works offline. The colour scale comes from /info (the same stops as the server's PNG
// overlay); the maps are drawn here so that any layer and head can be shown without asking
// the server again.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { info: null, table: null, cards: [] };

// A 256-entry colour table from the server's stops: [[position, [r, g, b]], ...].
function colorTable(stops) {
  const table = new Uint8ClampedArray(256 * 3);
  for (let level = 0; level < 256; level++) {
    const t = level / 255;
    let i = 0;
    while (i < stops.length - 2 && t > stops[i + 1][0]) i++;
    const [a, ca] = stops[i];
    const [b, cb] = stops[i + 1];
    const f = b > a ? Math.min(Math.max((t - a) / (b - a), 0), 1) : 0;
    for (let c = 0; c < 3; c++) table[level * 3 + c] = Math.round(ca[c] + f * (cb[c] - ca[c]));
  }
  return table;
}

function drawScale() {
  const canvas = $("scale");
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(256, canvas.height);
  for (let x = 0; x < 256; x++) {
    for (let y = 0; y < canvas.height; y++) {
      const o = (y * 256 + x) * 4;
      img.data.set(state.table.subarray(x * 3, x * 3 + 3), o);
      img.data[o + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
}

function fillOptions() {
  if (!state.info.attention) {  // a BiT ResNet: classes only, no map to choose
    $("layer").disabled = true;
    $("head").disabled = true;
    return;
  }
  const { layers, heads } = state.info.attention;
  for (let l = 1; l <= layers; l++) $("layer").add(new Option(`layer ${l} (class token)`, String(l - 1)));
  for (let h = 1; h <= heads; h++) $("head").add(new Option(`head ${h}`, String(h - 1)));
}

async function loadInfo() {
  const response = await fetch("/info");
  state.info = await response.json();
  state.table = colorTable(state.info.colormap);
  const { model, precision, parameters, classes } = state.info;
  $("model").textContent =
    `${model} (${precision}, ${(parameters / 1e6).toFixed(2)} M parameters, ${classes.length} classes)`;
  $("topk").max = String(classes.length);
  $("topk").value = String(Math.min(5, classes.length));
  $("keybox").hidden = !state.info.server.api_key_required;
  fillOptions();
  drawScale();
}

// The map chosen in the selectors for one result: the rollout, or one layer's head(s).
function chosenMap(attention) {
  const layer = $("layer").value;
  if (layer === "rollout") return attention.grid;
  const heads = attention.heads[Number(layer)];
  const head = $("head").value;
  if (head !== "mean") return heads[Number(head)];
  return heads[0].map((row, r) => row.map((_, c) => heads.reduce((s, h) => s + h[r][c], 0) / heads.length));
}

// The image fitted into a canvas; returns where it went. A small image (CIFAR's 32 px) is
// enlarged without smoothing, so that its real pixels show.
function drawImage(canvas, image) {
  const ctx = canvas.getContext("2d");
  const { width: W, height: H } = canvas;
  const scale = Math.min(W / image.width, H / image.height);
  const w = Math.round(image.width * scale);
  const h = Math.round(image.height * scale);
  const x0 = Math.floor((W - w) / 2);
  const y0 = Math.floor((H - h) / 2);
  ctx.clearRect(0, 0, W, H);
  ctx.imageSmoothingEnabled = scale < 3;
  ctx.drawImage(image, x0, y0, w, h);
  return { ctx, x0, y0, w, h };
}

function mapName() {
  const layer = $("layer").value;
  if (layer === "rollout") return "attention rollout, all layers";
  const head = $("head").value;
  return `layer ${Number(layer) + 1}, ${head === "mean" ? "mean of the heads" : `head ${Number(head) + 1}`}`;
}

// The image, with the map (scaled to its maximum) in colour over it; bilinear upsampling by
// the canvas, as the server's overlay does.
function drawCard(card) {
  drawImage(card.el.querySelector("canvas.photo"), card.image);
  const canvas = card.el.querySelector("canvas.view");
  const { ctx, x0, y0, w, h } = drawImage(canvas, card.image);
  if (!card.result.attention) return;
  const map = chosenMap(card.result.attention);
  const rows = map.length;
  const cols = map[0].length;
  const max = Math.max(...map.flat(), 1e-12);
  const small = document.createElement("canvas");
  small.width = cols;
  small.height = rows;
  const pixels = small.getContext("2d").createImageData(cols, rows);
  map.flat().forEach((v, i) => {
    const level = Math.round(Math.min(Math.max(v / max, 0), 1) * 255);
    pixels.data.set(state.table.subarray(level * 3, level * 3 + 3), i * 4);
    pixels.data[i * 4 + 3] = 255;
  });
  small.getContext("2d").putImageData(pixels, 0, 0);
  ctx.globalAlpha = Number($("opacity").value);
  ctx.imageSmoothingEnabled = true;
  ctx.drawImage(small, x0, y0, w, h);
  ctx.globalAlpha = 1;
  canvas.dataset.map = $("layer").value + "/" + $("head").value;
  card.el.querySelector(".what").textContent = mapName();
}

function showBars(card) {
  const list = card.el.querySelector(".bars");
  list.replaceChildren();
  for (const p of card.result.predictions) {
    const item = document.createElement("li");
    item.dataset.index = String(p.index);
    const label = document.createElement("div");
    label.className = "label";
    const name = document.createElement("span");
    name.className = "class";
    name.textContent = p.class;
    const value = document.createElement("span");
    value.className = "probability";
    value.textContent = `${(100 * p.probability).toFixed(1)}%`;
    label.append(name, value);
    const track = document.createElement("div");
    track.className = "track";
    const fill = document.createElement("div");
    fill.className = "fill";
    fill.style.width = `${(100 * p.probability).toFixed(2)}%`;
    track.append(fill);
    item.append(label, track);
    list.append(item);
  }
}

function newCard(file) {
  const el = $("card").content.firstElementChild.cloneNode(true);
  el.querySelector(".name").textContent = file.name;
  el.querySelector(".meta").textContent = "classifying…";
  el.dataset.state = "pending";
  $("results").append(el);
  return { el, file, image: null, result: null };
}

function fail(card, message) {
  card.el.dataset.state = "error";
  card.el.querySelector(".meta").textContent = "";
  const error = card.el.querySelector(".error");
  error.hidden = false;
  error.textContent = message;
}

async function classify(file) {
  const card = newCard(file);
  const body = new FormData();
  body.append("file", file, file.name);
  const headers = {};
  // A header carries bytes: the key's UTF-8, one character per byte (what curl sends), so a
  // non-ASCII key works (fetch refuses a header character above U+00FF).
  if ($("apikey").value) headers["X-API-Key"] = String.fromCharCode(...new TextEncoder().encode($("apikey").value));
  const maps = state.info.attention ? "attention=true&heads=true&" : "";
  const url = `/predict?${maps}top_k=${encodeURIComponent($("topk").value)}`;
  try {
    const [response, image] = await Promise.all([
      fetch(url, { method: "POST", body, headers }),
      createImageBitmap(file).catch(() => null),
    ]);
    const answer = await response.json();
    if (!response.ok) return fail(card, `${response.status}: ${answer.error}`);
    card.result = answer.results[0];
    card.image = image;
    card.el.querySelector(".meta").textContent =
      `${answer.model} · ${answer.precision} · ${answer.time_ms.toFixed(1)} ms · batch of ${card.result.batch_size}`;
    showBars(card);
    if (image) drawCard(card);
    state.cards.push(card);
    card.el.dataset.state = "done";
  } catch (e) {
    fail(card, `the request failed: ${e}`);
  }
}

async function classifyAll(files) {
  const images = [...files];
  $("status").textContent = `classifying ${images.length} image(s)…`;
  await Promise.all(images.map(classify)); // sent together: the server batches them
  $("status").textContent = `done: ${images.length} image(s)`;
}

function redraw() {
  $("head").disabled = $("layer").value === "rollout";
  for (const card of state.cards) if (card.image) drawCard(card);
}

function wire() {
  const drop = $("drop");
  $("picker").addEventListener("change", (e) => classifyAll(e.target.files));
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    classifyAll(e.dataTransfer.files);
  });
  for (const id of ["layer", "head", "opacity"]) $(id).addEventListener("input", redraw);
}

wire();
loadInfo().then(
  () => { document.body.dataset.ready = "true"; },
  (e) => { $("model").textContent = `cannot reach the server: ${e}`; },
);
