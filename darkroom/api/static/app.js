// darkroom web page: upload, watch each card to its end, view the WebP; queue dashboard.
// Plain script, no build step. Everything goes through the public /v1 API with the key.
"use strict";

const KEY_STORAGE = "darkroom.apiKey";
const ACCEPTED = ["image/jpeg", "image/png", "image/webp", "image/gif"];
const FINAL = new Set(["ready", "rejected"]);
const POLL_FIRST_MS = 500;
const POLL_MAX_MS = 5000;
const QUEUE_REFRESH_MS = 3000;
// A step whose answer was lost (network) or refused for a passing reason is sent again:
// the create with the same Idempotency-Key (so it never makes a second card), the PUT and
// the confirm as they are (both safe to repeat).
const RETRY_DELAYS_MS = [500, 1500, 4000];

// DESIGN §5 codes, in words a person understands.
const ERROR_TEXT = {
  unsupported_format: "This file isn't an image we can read. Please use JPEG, PNG, WebP or GIF.",
  invalid_image: "This image is damaged or incomplete, so it couldn't be opened.",
  image_too_large: "This image is too big (file size, pixel count or dimensions over the limit).",
  original_missing: "The uploaded original could no longer be found. Please upload it again.",
  storage_unavailable: "Storage was unavailable while processing this image. Please try again later.",
  processing_timeout: "Processing this image took too long and was stopped.",
  attempts_exhausted: "Processing this image failed several times, so we gave up.",
  processing_failed: "Something went wrong while processing this image.",
};

const STATUS_LABEL = {
  uploading: "uploading", pending: "pending", queued: "queued", processing: "processing",
  ready: "ready", rejected: "rejected", failed: "failed",
};

const $ = (sel, root = document) => root.querySelector(sel);
const state = { key: localStorage.getItem(KEY_STORAGE) || "", cards: new Map(), queueTimer: null };

// --- API ---------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, problem) {
    super((problem && problem.detail) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
  }
}

function authHeaders(extra = {}) {
  return { Authorization: `Bearer ${state.key}`, ...extra };
}

async function api(method, path, body, extraHeaders = {}) {
  const headers = authHeaders({
    ...(body === undefined ? {} : { "Content-Type": "application/json" }), ...extraHeaders,
  });
  let response;
  try {
    response = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (_) {
    throw new ApiError(0, { detail: "network" });  // no answer: the request may have acted
  }
  if (response.status === 401) keyRejected();
  if (!response.ok) {
    let problem = null;
    try { problem = await response.json(); } catch (_) { /* not JSON: keep the status */ }
    throw new ApiError(response.status, problem);
  }
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

function sameOrigin(url) {
  return new URL(url, location.href).origin === location.origin;
}

// PUT the bytes with upload progress. Resolves with the store's version id.
function putWithProgress(upload, file, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    const own = sameOrigin(upload.url);
    xhr.open(upload.method || "PUT", upload.url);
    for (const [name, value] of Object.entries(upload.headers || {})) xhr.setRequestHeader(name, value);
    if (own) xhr.setRequestHeader("Authorization", `Bearer ${state.key}`);
    xhr.upload.onprogress = (e) => { if (e.lengthComputable) onProgress(e.loaded / e.total); };
    xhr.onerror = () => reject(new ApiError(0, { detail: "network" }));
    xhr.onload = () => {
      if (xhr.status < 200 || xhr.status >= 300) {
        let problem = null;
        try { problem = JSON.parse(xhr.responseText); } catch (_) { /* keep the status */ }
        reject(new ApiError(xhr.status, problem));
        return;
      }
      let version = null;
      if (own) {
        try { version = JSON.parse(xhr.responseText).version; } catch (_) { version = null; }
      } else {
        // A presigned S3 PUT: the version id is a response header, readable only if the
        // bucket's CORS exposes it.
        version = xhr.getResponseHeader("x-amz-version-id");
      }
      if (version) resolve(version);
      else reject(new ApiError(0, { detail: "no version" }));
    };
    xhr.send(file);
  });
}

// --- cards -------------------------------------------------------------------------------

function cardElement(id) {
  const entry = state.cards.get(id);
  return entry ? entry.el : null;
}

function newCardElement(filename) {
  const el = $("#card-template").content.firstElementChild.cloneNode(true);
  $('[data-testid="filename"]', el).textContent = filename;
  $('[data-testid="filename"]', el).title = filename;
  $(".grid").prepend(el);
  updateEmpty();
  return el;
}

function setStatus(el, status) {
  el.dataset.status = status;
  const badge = $('[data-testid="status"]', el);
  badge.dataset.status = status;
  badge.textContent = STATUS_LABEL[status] || status;
}

function setProgress(el, fraction) {
  const bar = $('[data-testid="progress"]', el);
  if (fraction === null) { bar.hidden = true; return; }
  bar.hidden = false;
  $("span", bar).style.width = `${Math.round(fraction * 100)}%`;
}

function setNote(el, message) {
  const p = $('[data-testid="note"]', el);
  p.hidden = !message;
  p.textContent = message || "";
}

function showRetry(el, onRetry) {
  const button = $('[data-testid="retry"]', el);
  button.hidden = !onRetry;
  button.onclick = onRetry ? () => { button.hidden = true; onRetry(); } : null;
}

function setError(el, message) {
  const p = $('[data-testid="error"]', el);
  p.hidden = !message;
  p.textContent = message || "";
}

function formatBytes(n) {
  if (n === null || n === undefined) return "";
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KB`;
  return `${(n / 1024 / 1024).toFixed(1)} MB`;
}

function apiErrorText(error) {
  const type = (error.problem && error.problem.type) || "";
  if (error.status === 413) {
    const limit = error.problem && error.problem.limit;
    return limit ? `This file is larger than the upload limit of ${formatBytes(limit)}.`
      : "This file is larger than the upload limit.";
  }
  if (error.status === 422 && (error.problem.errors || []).some((e) => e.field === "content_type")) {
    return ERROR_TEXT.unsupported_format;
  }
  if (error.status === 401) return "Your API key was not accepted.";
  if (type.endsWith("/digest_mismatch")) {
    return "The file changed while it was being uploaded. Please try again.";
  }
  if (error.status === 503 || type.endsWith("/storage_unavailable")) {
    return "The service is busy or unavailable right now. Please try again in a moment.";
  }
  if (error.status === 0) return "The upload could not reach the server. Check your connection and try again.";
  return "Something went wrong with this upload. Please try again.";
}

function render(card) {
  let entry = state.cards.get(card.id);
  if (!entry) {
    entry = { el: newCardElement(card.filename), previewLoaded: false, timer: null };
    state.cards.set(card.id, entry);
    wireDelete(card.id, entry.el);
  }
  const el = entry.el;
  el.dataset.id = card.id;
  setStatus(el, card.status);
  setError(el, card.status === "rejected"
    ? (ERROR_TEXT[card.error_code] || ERROR_TEXT.processing_failed) : "");
  const meta = $('[data-testid="meta"]', el);
  if (card.status === "ready" && card.derivative) {
    meta.textContent = `${card.derivative.width}×${card.derivative.height} · ${formatBytes(card.derivative.bytes)} WebP`;
    if (!entry.previewLoaded) { entry.previewLoaded = true; loadPreview(card, el); }
  } else {
    meta.textContent = formatBytes(card.size);
  }
  if (card.status !== "pending") setProgress(el, null);
}

async function loadPreview(card, el) {
  // The derivative route needs the bearer key, which an <img src> cannot send: fetch it as
  // a blob and show an object URL. For S3 the route redirects to a presigned URL.
  try {
    const response = await fetch(card.derivative.url, { headers: authHeaders() });
    if (!response.ok) throw new ApiError(response.status, null);
    const url = URL.createObjectURL(await response.blob());
    const img = $('[data-testid="preview"]', el);
    img.onload = () => { img.hidden = false; $('[data-testid="placeholder"]', el).hidden = true; };
    img.alt = card.filename;
    img.src = url;
  } catch (_) {
    setError(el, "The preview could not be loaded.");
  }
}

function watch(id, delay = POLL_FIRST_MS) {
  const entry = state.cards.get(id);
  if (!entry) return;
  clearTimeout(entry.timer);
  entry.timer = setTimeout(async () => {
    if (!state.cards.has(id)) return;
    try {
      const card = await api("GET", `/v1/files/${id}`);
      render(card);
      if (!FINAL.has(card.status)) watch(id, Math.min(delay * 1.25, POLL_MAX_MS));
    } catch (error) {
      if (error.status === 404) { removeCard(id); return; }
      watch(id, Math.min(delay * 2, POLL_MAX_MS));
    }
  }, delay);
}

function removeCard(id) {
  const entry = state.cards.get(id);
  if (!entry) return;
  clearTimeout(entry.timer);
  const img = $('[data-testid="preview"]', entry.el);
  if (img.src.startsWith("blob:")) URL.revokeObjectURL(img.src);
  entry.el.remove();
  state.cards.delete(id);
  updateEmpty();
}

function wireDelete(id, el) {
  $('[data-testid="delete"]', el).addEventListener("click", async () => {
    const button = $('[data-testid="delete"]', el);
    button.disabled = true;
    try {
      await api("DELETE", `/v1/files/${id}`);
      removeCard(id);
    } catch (error) {
      if (error.status === 404) removeCard(id);
      else { button.disabled = false; setError(el, "This file could not be deleted. Please try again."); }
    }
  });
}

function updateEmpty() {
  $('[data-testid="empty"]').hidden = $(".grid").children.length > 0;
}

// A file that never became a card (refused before or at creation) gets a local card.
function localFailure(filename, message) {
  const el = newCardElement(filename);
  setStatus(el, "failed");
  setError(el, message);
  $('[data-testid="delete"]', el).addEventListener("click", () => { el.remove(); updateEmpty(); });
  return el;
}

function randomKey() {
  if (crypto.randomUUID) return crypto.randomUUID();
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// The file's SHA-256, so the archive can say it has these bytes already. Browsers offer
// it only to secure origins (https, or the machine itself); elsewhere nothing is claimed.
async function sha256Hex(file) {
  if (!(window.crypto && crypto.subtle)) return null;
  try {
    const digest = await crypto.subtle.digest("SHA-256", await file.arrayBuffer());
    return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
  } catch (_) {
    return null;
  }
}

function transient(error) {
  return error.status === 0 || error.status === 408 || error.status === 429 || error.status >= 500;
}

async function withRetries(step) {
  for (let i = 0; ; i++) {
    try {
      return await step();
    } catch (error) {
      if (!transient(error) || i >= RETRY_DELAYS_MS.length) throw error;
      await new Promise((resolve) => setTimeout(resolve, RETRY_DELAYS_MS[i]));
    }
  }
}

async function putOriginal(card, file, type, el) {
  try {
    return await putWithProgress(card.upload, file, (f) => setProgress(el, f));
  } catch (error) {
    // A direct-to-store upload the browser could not complete or read (typically the
    // bucket's CORS): send the bytes through the API instead.
    if (error.status !== 0 || sameOrigin(card.upload.url)) throw error;
    const viaApi = { method: "PUT", url: `/v1/files/${card.id}/content`, headers: { "Content-Type": type } };
    return putWithProgress(viaApi, file, (f) => setProgress(el, f));
  }
}

// One upload: its Idempotency-Key is made once per dropped file and kept for every retry,
// automatic or by the Retry button, so no retry can make a second card.
async function uploadFile(file, job = { key: randomKey(), sha256: undefined, local: null }) {
  const type = (file.type || "").toLowerCase();
  if (!ACCEPTED.includes(type)) {
    localFailure(file.name, ERROR_TEXT.unsupported_format);
    return;
  }
  if (job.sha256 === undefined) job.sha256 = await sha256Hex(file);
  const body = { filename: file.name, content_type: type, size: file.size };
  if (job.sha256) body.sha256 = job.sha256;
  let card;
  try {
    card = await withRetries(() => api("POST", "/v1/files", body, { "Idempotency-Key": job.key }));
  } catch (error) {
    job.local = localFailure(file.name, apiErrorText(error));
    if (transient(error)) showRetry(job.local, () => { job.local.remove(); uploadFile(file, job); });
    return;
  }
  if (!card.upload) {
    // Nothing to upload: the archive has these bytes (`duplicate_of`), or an earlier try
    // with this key already finished.
    const shown = state.cards.has(card.id);
    render(card);
    const el = cardElement(card.id);
    showRetry(el, null);
    if (card.duplicate_of) {
      setNote(el, `“${file.name}” is already in your archive, so it was not uploaded again.`);
      if (shown) el.scrollIntoView({ block: "nearest" });
    }
    if (!FINAL.has(card.status)) watch(card.id);
    return;
  }
  render(card);
  const el = cardElement(card.id);
  showRetry(el, null);
  setError(el, "");
  setStatus(el, "uploading");
  setProgress(el, 0);
  try {
    let confirmed = null;
    if (card.uploaded_version) {  // an earlier try stored the bytes but was not confirmed
      try {
        confirmed = await api("POST", `/v1/files/${card.id}/confirm`, { version: card.uploaded_version });
      } catch (_) {
        confirmed = null;  // upload again
      }
    }
    if (!confirmed) {
      const version = await withRetries(() => putOriginal(card, file, type, el));
      setProgress(el, 1);
      confirmed = await withRetries(() => api("POST", `/v1/files/${card.id}/confirm`, { version }));
    }
    render(confirmed);
    watch(card.id);
  } catch (error) {
    setProgress(el, null);
    setStatus(el, "failed");
    setError(el, apiErrorText(error));
    showRetry(el, () => uploadFile(file, job));
  }
}

function uploadAll(files) {
  if (!state.key) { showNotice("Enter your API key first."); return; }
  for (const file of files) uploadFile(file);
}

async function loadCards() {
  try {
    const page = await api("GET", "/v1/files?limit=100");
    for (const card of page.items.slice().reverse()) {
      render(card);
      if (!FINAL.has(card.status) && card.status !== "pending") watch(card.id);
    }
  } catch (error) {
    if (error.status !== 401) showNotice("Your files could not be loaded. Please reload the page.");
  }
  updateEmpty();
}

// --- queue panel (admin keys only) ------------------------------------------------------

function share(value) {
  if (value === null || value === undefined) return "–";
  const percent = value * 100;
  return `${Number.isInteger(percent) ? percent : percent.toFixed(1)}%`;
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "none";
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function renderOwners(owners) {
  const table = $('[data-testid="q-owners"]');
  const rows = owners.map((o) => {
    const tr = document.createElement("tr");
    tr.dataset.owner = o.owner;
    for (const value of [o.owner, o.waiting, o.interactive, o.bulk, age(o.oldest_wait_seconds)]) {
      const td = document.createElement("td");
      td.textContent = String(value);  // owner names are data, never markup
      tr.append(td);
    }
    return tr;
  });
  table.querySelector("tbody").replaceChildren(...rows);
  table.hidden = rows.length === 0;
}

async function refreshQueue() {
  const panel = $('[data-testid="queue-panel"]');
  try {
    const s = await api("GET", "/v1/queue");
    for (const status of ["queued", "processing", "ready", "rejected", "pending", "deleting"]) {
      $(`[data-testid="q-${status}"]`).textContent = s.counts[status] ?? 0;
    }
    $('[data-testid="q-oldest"]').textContent = age(s.oldest_claimable_age_seconds);
    $('[data-testid="q-expired"]').textContent = s.expired_leases;
    $('[data-testid="q-rejected-share"]').textContent = `${share(s.rejected_share_1h)} · ${share(s.rejected_share_24h)}`;
    $('[data-testid="q-completed"]').textContent = s.completed_last_minute;
    $('[data-testid="q-lease-lost"]').textContent = s.lease_lost_total;
    const byPriority = (s.backlog && s.backlog.by_priority) || {};
    for (const priority of ["interactive", "bulk"]) {
      const b = byPriority[priority];
      $(`[data-testid="q-${priority}"]`).textContent =
        b ? `${b.waiting}${b.waiting ? ` · oldest ${age(b.oldest_wait_seconds)}` : ""}` : "0";
    }
    $('[data-testid="q-rederive"]').textContent = s.rederive_pending ?? 0;
    renderOwners((s.backlog && s.backlog.top_owners) || []);
    panel.hidden = false;
  } catch (error) {
    if (error.status === 403 || error.status === 401) { panel.hidden = true; stopQueue(); return; }
    // Anything else is passing: keep the panel and try again at the next tick.
  }
}

function startQueue() {
  stopQueue();
  refreshQueue();
  state.queueTimer = setInterval(refreshQueue, QUEUE_REFRESH_MS);
}

function stopQueue() {
  if (state.queueTimer) clearInterval(state.queueTimer);
  state.queueTimer = null;
}

// --- key ---------------------------------------------------------------------------------

function showNotice(message) {
  const notice = $('[data-testid="notice"]');
  notice.textContent = message || "";
  notice.hidden = !message;
}

function keyRejected() {
  showNotice("Your API key was not accepted. Please enter a valid key.");
  forgetKey(false);
}

function forgetKey(clearNotice = true) {
  state.key = "";
  localStorage.removeItem(KEY_STORAGE);
  stopQueue();
  for (const id of [...state.cards.keys()]) removeCard(id);
  $(".grid").replaceChildren();
  updateEmpty();
  $('[data-testid="queue-panel"]').hidden = true;
  $('[data-testid="key-form"]').hidden = false;
  $('[data-testid="key-set"]').hidden = true;
  if (clearNotice) showNotice("");
}

function useKey(key) {
  state.key = key;
  localStorage.setItem(KEY_STORAGE, key);
  $('[data-testid="key-form"]').hidden = true;
  $('[data-testid="key-set"]').hidden = false;
  $('[data-testid="key-hint"]').textContent = `${key.slice(0, 6)}…${key.slice(-4)}`;
  showNotice("");
  loadCards();
  startQueue();
}

// --- wiring ------------------------------------------------------------------------------

function init() {
  $('[data-testid="key-form"]').addEventListener("submit", (e) => {
    e.preventDefault();
    const key = $('[data-testid="key-input"]').value.trim();
    if (key) { $('[data-testid="key-input"]').value = ""; useKey(key); }
  });
  $('[data-testid="key-forget"]').addEventListener("click", () => forgetKey());

  const input = $('[data-testid="file-input"]');
  input.addEventListener("change", () => { uploadAll([...input.files]); input.value = ""; });

  const zone = $('[data-testid="dropzone"]');
  zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (e) => {
    e.preventDefault();
    zone.classList.remove("over");
    uploadAll([...e.dataTransfer.files]);
  });
  zone.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") input.click(); });
  zone.addEventListener("click", (e) => { if (e.target === zone) input.click(); });

  if (state.key) useKey(state.key);
  else updateEmpty();
}

document.addEventListener("DOMContentLoaded", init);
