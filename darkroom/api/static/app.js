// darkroom web page: upload many files, page through the archive, view a preview; queue dashboard.
// An ES module, no build step. Everything goes through the public /v1 API with the key.
//
// Built for archives of thousands of files: the grid pages through GET /v1/files with its
// cursor as the user scrolls, each card paints its thumbhash at once and fetches its small
// thumb only when it comes near the viewport, and status changes arrive over ONE
// server-sent event stream (GET /v1/events) instead of a timer per card.
import { thumbHashToRGBA } from "./thumbhash.js";

const KEY_STORAGE = "darkroom.apiKey";
const ACCEPTED = ["image/jpeg", "image/png", "image/webp", "image/gif",
  "image/heic", "image/heif", "image/avif", "image/tiff"];
// Browsers often give no type for HEIC, HEIF, AVIF or TIFF files: go by the name then.
const BY_EXTENSION = {
  jpg: "image/jpeg", jpeg: "image/jpeg", png: "image/png", webp: "image/webp", gif: "image/gif",
  heic: "image/heic", heif: "image/heif", avif: "image/avif", tif: "image/tiff", tiff: "image/tiff",
};
const FORMATS_TEXT = "JPEG, PNG, WebP, GIF, HEIC, AVIF or TIFF";
const FINAL = new Set(["ready", "rejected"]);
const PAGE_SIZE = 100;
// How long a grid's first read waits for the live stream's `open` (whenStreamOpen).
const OPEN_WAIT_MS = 1500;
// A re-read reads this many listing pages past those loaded, for cards added above.
const RELIST_EXTRA_PAGES = 3;
// A re-read whose listing failed is tried again this much later.
const RELIST_RETRY_MS = 5000;
// Cards a re-read looks up one by one at most; past that the grid is read anew.
const REFRESH_AT_MOST = 50;
// Stream events about cards not shown yet that are remembered (the oldest go first).
const UNSHOWN_AT_MOST = 2000;
const QUEUE_REFRESH_MS = 3000;
// Chromium opens six connections to one host: one holds the event stream, thumbs take at
// most four, and one stays free so that a page of the listing or the viewer's preview never
// waits behind a screenful of thumbs.
const THUMBS_AT_ONCE = 4;
const UPLOADS_AT_ONCE = 3;
// A step whose answer was lost (network) or refused for a passing reason is sent again:
// the create with the same Idempotency-Key (so it never makes a second card), the PUT and
// the confirm as they are (both safe to repeat).
const RETRY_DELAYS_MS = [500, 1500, 4000];
const STREAM_RETRY_MS = [1000, 2000, 5000, 10000, 30000];

// DESIGN §5 codes, in words a person understands.
const ERROR_TEXT = {
  unsupported_format: `This file isn't an image we can read. Please use ${FORMATS_TEXT}.`,
  invalid_image: "This image is damaged or incomplete, so it couldn't be opened.",
  image_too_large: "This image is too big (file size, pixel count or dimensions over the limit).",
  original_missing: "The uploaded original could no longer be found. Please upload it again.",
  storage_unavailable: "Storage was unavailable while processing this image. Please try again later.",
  processing_timeout: "Processing this image took too long and was stopped.",
  attempts_exhausted: "Processing this image failed several times, so we gave up.",
  processing_failed: "Something went wrong while processing this image.",
};

// Rejected for a fault that was not the file's own: its owner may queue it again
// (POST /v1/files/{id}/retry); the same bytes would fail the same way for any other code.
const RETRYABLE = new Set(["storage_unavailable", "processing_timeout", "attempts_exhausted"]);

const STATUS_LABEL = {
  uploading: "uploading", pending: "pending", queued: "queued", processing: "processing",
  ready: "ready", rejected: "rejected", failed: "failed",
};

const $ = (sel, root = document) => root.querySelector(sel);
const state = {
  key: localStorage.getItem(KEY_STORAGE) || "",
  cards: new Map(),          // id -> { el, card, thumbLoaded }
  queueTimer: null,
  filter: "",                // a status, or "" for all
  code: "",                  // an error code (with filter "rejected"), or ""
  allOwners: false,          // the console's view: every owner's rejected cards (admin)
  admin: false,              // the key answered /v1/queue
  cursor: null,              // next_cursor of the last page read
  more: false,               // another page exists
  loading: false,
  generation: 0,             // bumps on key or filter change: late answers are dropped
  stream: null,              // AbortController of the event stream
  streamFailures: 0,
  streamEnd: null,           // why the server ended the stream (its `end` event)
  streamOpen: false,         // its `open` came: every later change is sent to it
  opens: 0,                  // how many times a stream has said `open`
  shownBeforeOpen: false,    // an answer was read before that: re-read on `open`
  pagesLoaded: 0,            // the listing's pages the grid shows
  seq: 0,                    // one count of requests sent and stream events (tick)
  unshown: new Map(),        // id → {seq, gone} of a change to a card not shown (noteChange)
  refreshing: new Map(),     // id → whether another read is owed once the one on its way ends
  relistRetry: null,         // the one timer that retries a failed re-read
  onOpen: [],                // what waits for the stream's `open` (whenStreamOpen)
  resyncing: false,          // a re-read of what the page shows is running
  resyncAgain: false,        // ... and another was asked for meanwhile
  thumbs: null,              // IntersectionObserver for lazy thumbs
  thumbsWanted: new Set(),   // ids near the viewport whose thumb waits for a connection
  thumbsFetching: 0,
  uploads: { total: 0, sent: 0, files: 0, done: 0, running: 0, waiting: [] },
};
// Counters for tests and operators: what the page did, without timing anything.
window.darkroomStats = { pings: 0, events: 0, pages: 0, streams: 0, rereads: 0, cardReads: 0 };

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

// An answer read before the live stream's `open` may show a card as it was before a
// change that reaches neither it nor the stream: the cards on their way are re-read once
// the stream is open (judged by when the request was sent, not when its answer came).
function answeredBeforeOpen() {
  if (!state.streamOpen) state.shownBeforeOpen = true;
  else setTimeout(resync, 0);  // opened meanwhile: once this answer is shown
}

async function api(method, path, body, extraHeaders = {}) {
  const sentAfterOpen = state.streamOpen ? state.opens : -1;
  const sent = tick();
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
  if (sentAfterOpen !== state.opens || !state.streamOpen) answeredBeforeOpen();
  const answer = text ? JSON.parse(text) : null;
  if (answer && typeof answer === "object") {
    Object.defineProperty(answer, "__sent", { value: sent });  // not enumerable: not copied
  }
  return answer;
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

function newCardElement(filename, atTop, before = null) {
  const el = $("#card-template").content.firstElementChild.cloneNode(true);
  $('[data-testid="filename"]', el).textContent = filename;
  $('[data-testid="filename"]', el).title = filename;
  if (before) $(".grid").insertBefore(el, before);
  else if (atTop) $(".grid").prepend(el);
  else $(".grid").append(el);
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

function setError(el, message) {
  const p = $('[data-testid="error"]', el);
  p.hidden = !message;
  p.textContent = message || "";
  p.title = message || "";
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
  if (type.endsWith("/quota_exceeded")) {
    return "Your storage quota is full. Delete some files before uploading more.";
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

// The thumbhash painted on a canvas: colour at once, before any thumb is fetched. (A canvas
// rather than a data: URL, which the page's Content-Security-Policy does not allow.)
function placeholderFor(card, el) {
  const ph = $('[data-testid="placeholder"]', el);
  if (card.thumbhash && !ph.dataset.hash) {
    try {
      const bytes = Uint8Array.from(atob(card.thumbhash), (c) => c.charCodeAt(0));
      const { w, h, rgba } = thumbHashToRGBA(bytes);
      const canvas = document.createElement("canvas");
      canvas.width = w;
      canvas.height = h;
      canvas.getContext("2d").putImageData(new ImageData(new Uint8ClampedArray(rgba), w, h), 0, 0);
      ph.replaceChildren(canvas);
      ph.dataset.hash = "1";
      ph.classList.add("hashed");
    } catch (_) { /* a bad hash only costs the colour */ }
  }
}

// One count for the requests the page sends and the stream events it gets: a card read by
// a request sent before an event about it shows the card as it was before that event.
function tick() {
  state.seq += 1;
  return state.seq;
}

// A change to card `id` the page learnt of now (a stream event, or the card `gone`):
// remembered for a card not shown (a listing on its way may hold it as it was). Answers
// the tick.
function noteChange(id, gone) {
  const seq = tick();
  if (gone || !state.cards.has(id)) {
    state.unshown.delete(id);
    state.unshown.set(id, { seq, gone });
    if (state.unshown.size > UNSHOWN_AT_MOST) state.unshown.delete(state.unshown.keys().next().value);
  }
  return seq;
}

// `sent`: the tick its request was sent at (api() marks its answers); undefined for what
// the page itself changed. A read older than the one shown is not drawn; one older than
// a stream event about the card is drawn only if the card is new to the page, and the
// card is read again either way.
function render(card, atTop = false, sent = card.__sent, before = null) {
  let entry = state.cards.get(card.id);
  let changed = 0;
  if (sent !== undefined) {
    const note = entry ? null : state.unshown.get(card.id);
    changed = entry ? entry.changed || 0 : note ? note.seq : 0;
    if (entry && sent < (entry.sent || 0)) return;
    if (sent < changed) {
      // Gone since this read was sent: it stays gone (a deleted card never comes back).
      if (note && note.gone) return;
      refreshCard(card.id);
      if (entry) return;
    }
    if (note) state.unshown.delete(card.id);
  }
  if (!entry) {
    entry = { el: newCardElement(card.filename, atTop, before), card, thumbLoaded: false,
              changed };
    state.cards.set(card.id, entry);
    wireCard(card.id, entry.el);
    state.thumbs.observe(entry.el);
  }
  if (sent !== undefined) entry.sent = sent;
  entry.card = card;
  const el = entry.el;
  el.dataset.id = card.id;
  setStatus(el, card.status);
  setError(el, card.status === "rejected"
    ? (ERROR_TEXT[card.error_code] || ERROR_TEXT.processing_failed) : "");
  // The upload's own Retry (a step that failed before the card was queued) is left alone.
  const retryable = card.status === "rejected" && RETRYABLE.has(card.error_code);
  const pick = $('[data-testid="pick"]', el);
  pick.hidden = !(retryable && state.allOwners);
  if (pick.hidden) pick.checked = false;
  if (retryable) {
    // Another owner's card (the console's view) goes back through the admin's route.
    showRetry(el, () => (state.allOwners ? retryPicked([card.id]) : retryCard(card.id)));
    el.dataset.cardRetry = "1";
  } else if (el.dataset.cardRetry) {
    showRetry(el, null);
    delete el.dataset.cardRetry;
  }
  const meta = $('[data-testid="meta"]', el);
  if (card.status === "ready" && card.derivative) {
    meta.textContent = `${card.derivative.width}×${card.derivative.height} · ${formatBytes(card.derivative.bytes)}`;
    placeholderFor(card, el);
    if (el.dataset.visible === "1") wantThumb(card.id);
  } else {
    meta.textContent = formatBytes(card.size);
  }
  if (card.status !== "pending") setProgress(el, null);
  if (state.allOwners) updatePicking();
}

// Thumbs are fetched only for cards near the viewport: a grid of thousands downloads what
// is seen. A card scrolled past before its turn came is dropped from the wait, so a fast
// scroll through the archive does not leave hundreds of fetches queued in the browser.
function wantThumb(id) {
  const entry = state.cards.get(id);
  if (!entry || entry.thumbLoaded || entry.card.status !== "ready") return;
  state.thumbsWanted.add(id);
  pumpThumbs();
}

function pumpThumbs() {
  while (state.thumbsFetching < THUMBS_AT_ONCE && state.thumbsWanted.size > 0) {
    const id = state.thumbsWanted.values().next().value;
    state.thumbsWanted.delete(id);
    const entry = state.cards.get(id);
    if (!entry || entry.thumbLoaded || entry.card.status !== "ready") continue;
    state.thumbsFetching += 1;
    loadThumb(entry).finally(() => { state.thumbsFetching -= 1; pumpThumbs(); });
  }
}

// The route needs the bearer key, which an <img src> cannot send: fetch a blob.
async function loadThumb(entry) {
  entry.thumbLoaded = true;
  const card = entry.card;
  const url = (card.derivatives && card.derivatives.thumb.url) || card.derivative.url;
  try {
    const response = await fetch(url, { headers: authHeaders(), priority: "low" });
    if (!response.ok) throw new ApiError(response.status, null);
    const blob = URL.createObjectURL(await response.blob());
    const img = $('[data-testid="preview"]', entry.el);
    img.onload = () => { img.hidden = false; $('[data-testid="placeholder"]', entry.el).hidden = true; };
    img.alt = card.filename;
    img.src = blob;
  } catch (_) {
    entry.thumbLoaded = false;
    setError(entry.el, "The thumbnail could not be loaded.");
  }
}

// `gone`: the card no longer exists (deleted, or 404): a read sent before this does not
// bring it back. A grid emptied for another view or key takes its cards out without.
function removeCard(id, gone = true) {
  if (gone) noteChange(id, true);
  const entry = state.cards.get(id);
  if (!entry) return;
  state.thumbs.unobserve(entry.el);
  state.thumbsWanted.delete(id);
  const img = $('[data-testid="preview"]', entry.el);
  if (img.src.startsWith("blob:")) URL.revokeObjectURL(img.src);
  entry.el.remove();
  state.cards.delete(id);
  updateEmpty();
  if (state.allOwners) updatePicking();
}

async function deleteCard(id) {
  const el = cardElement(id);
  const button = el && $('[data-testid="delete"]', el);
  if (button) button.disabled = true;
  try {
    await api("DELETE", `/v1/files/${id}`);
    removeCard(id);
    return true;
  } catch (error) {
    if (error.status === 404) { removeCard(id); return true; }
    if (button) button.disabled = false;
    if (el) setError(el, "This file could not be deleted. Please try again.");
    return false;
  }
}

// A rejected card back in the queue: the answer is the card, queued again.
async function retryCard(id) {
  const el = cardElement(id);
  const generation = state.generation;
  try {
    const card = await api("POST", `/v1/files/${id}/retry`);
    if (generation === state.generation) render(card);
  } catch (error) {
    if (error.status === 404) { removeCard(id); return; }
    if (!el) return;
    if (error.status === 409) {
      // Someone (another tab, an operator) changed it meanwhile: show it as it is now.
      refreshCard(id);
      return;
    }
    showRetry(el, () => retryCard(id));
    setError(el, "The retry could not be sent. Please try again.");
  }
}

// --- an admin's picked retry (the console's view of every owner's rejected cards) -------

// The cards shown that a retry would take: rejected with a retryable code.
function pickable() {
  return [...state.cards.values()].filter((e) => !$('[data-testid="pick"]', e.el).hidden);
}

function updatePicking() {
  const picking = $('[data-testid="picking"]');
  picking.hidden = !(state.allOwners && RETRYABLE.has(state.code));
  if (picking.hidden) return;
  const shown = pickable();
  const chosen = shown.filter((e) => $('[data-testid="pick"]', e.el).checked);
  const selected = $('[data-testid="retry-selected"]');
  selected.disabled = chosen.length === 0;
  selected.textContent = chosen.length ? `Retry selected (${chosen.length})` : "Retry selected";
  const all = $('[data-testid="retry-shown"]');
  all.textContent = `Retry all ${shown.length} shown`;
  all.disabled = shown.length === 0;
  const pickAll = $('[data-testid="pick-all"]');
  pickAll.checked = shown.length > 0 && chosen.length === shown.length;
  pickAll.indeterminate = chosen.length > 0 && chosen.length < shown.length;
}

const PICKED_PER_REQUEST = 500;  // the route's bound

// Any owner's cards, queued again by the admin's route; the answer says per card where
// it stands (a repeat whose first answer was lost finds them queued: not_rejected).
async function retryPicked(ids) {
  const result = $('[data-testid="retry-result"]');
  let queued = 0;
  let failed = false;
  for (let i = 0; i < ids.length; i += PICKED_PER_REQUEST) {
    const chunk = ids.slice(i, i + PICKED_PER_REQUEST);
    try {
      // Safe to repeat: a card queued by a lost answer is not queued twice.
      const answer = await withRetries(() => api("POST", "/v1/queue/retry", { ids: chunk }));
      queued += answer.queued;
      for (const r of answer.results) {
        const entry = state.cards.get(r.id);
        if (!entry) continue;
        if (r.outcome === "not_found") { removeCard(r.id); continue; }
        if (r.status !== entry.card.status) {
          render({ ...entry.card, status: r.status, error_code: r.status === "rejected" ? entry.card.error_code : null });
        }
      }
    } catch (_) {
      failed = true;
      for (const id of chunk) {
        const entry = state.cards.get(id);
        if (entry && entry.card.status === "rejected") render(entry.card);  // its Retry back
      }
    }
  }
  result.textContent = failed
    ? `Queued ${queued}; the rest could not be sent. Please try again.`
    : `Queued ${queued} of ${ids.length} again.`;
  updatePicking();
  refreshQueue();
}

function retryChosen(which) {
  const ids = pickable()
    .filter((e) => which === "all" || $('[data-testid="pick"]', e.el).checked)
    .map((e) => e.card.id);
  if (ids.length) retryPicked(ids);
}

function wireCard(id, el) {
  $('[data-testid="pick"]', el).addEventListener("change", updatePicking);
  $('[data-testid="delete"]', el).addEventListener("click", (e) => { e.stopPropagation(); deleteCard(id); });
  const open = () => { const entry = state.cards.get(id); if (entry) openViewer(entry.card); };
  $(".thumb", el).addEventListener("click", open);
  $('[data-testid="filename"]', el).addEventListener("click", open);
}

function updateEmpty() {
  $('[data-testid="empty"]').hidden = $(".grid").children.length > 0 || state.loading;
}

// --- paging ------------------------------------------------------------------------------

// One page of the listing the grid shows, after `cursor` (the first page without one).
function listQuery(cursor) {
  const query = new URLSearchParams({ limit: String(PAGE_SIZE) });
  if (state.filter) query.set("status", state.filter);
  if (state.code) query.set("code", state.code);
  if (state.allOwners) query.set("all_owners", "true");
  if (cursor) query.set("cursor", cursor);
  return query;
}

// The grid holds the listing up to `page`: where its next read starts, and whether any.
function tookPage(page) {
  state.cursor = page.next_cursor || "";
  state.more = Boolean(page.next_cursor);
  $('[data-testid="more"]').hidden = !state.more;
}

async function loadPage() {
  if (state.loading || !state.key || (!state.more && state.cursor !== null)) return;
  state.loading = true;
  const generation = state.generation;
  try {
    const page = await api("GET", `/v1/files?${listQuery(state.cursor)}`);
    if (generation !== state.generation) return;
    window.darkroomStats.pages += 1;
    state.pagesLoaded += 1;
    for (const card of page.items) drawListed(card, page.__sent);
    tookPage(page);
  } catch (error) {
    if (error.status !== 401) showNotice("Your files could not be loaded. Please reload the page.");
  } finally {
    if (generation === state.generation) state.loading = false;
    updateEmpty();
  }
  // Still room below the last card (a tall window): keep filling it.
  if (generation === state.generation && state.more && sentinelVisible()) loadPage();
}

function sentinelVisible() {
  const rect = $('[data-testid="more"]').getBoundingClientRect();
  return rect.top < window.innerHeight + 800;
}

// The grid emptied for a read from its first page. With `keepLocal`, this page's own
// uploads under way (or failed before their card was queued) stay where they are, at the
// top: they are the upload flow's.
function resetGrid(keepLocal = false) {
  state.generation += 1;  // answers for the grid as it was are dropped
  for (const [id, entry] of [...state.cards]) {
    if (!(keepLocal && isLocal(entry))) removeCard(id, false);
  }
  if (!keepLocal) $(".grid").replaceChildren();
  state.cursor = null;
  state.more = false;
  state.loading = false;
  state.pagesLoaded = 0;
  state.refreshing = new Map();
}

// --- live status (server-sent events) -----------------------------------------------------

async function openStream() {
  closeStream();
  if (!state.key) return;
  const controller = new AbortController();
  state.stream = controller;
  state.streamEnd = null;
  state.streamOpen = false;
  window.darkroomStats.streams += 1;
  try {
    const response = await fetch("/v1/events", { headers: authHeaders(), signal: controller.signal });
    if (response.status === 401) { keyRejected(); return; }
    if (!response.ok || !response.body) throw new ApiError(response.status, null);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        handleEvent(block);
      }
    }
  } catch (_) {
    if (controller.signal.aborted) return;
  }
  if (state.stream !== controller) return;
  if (state.streamEnd === "replaced") {
    // The owner opened more pages than the server keeps streams for: this, the oldest,
    // gives way rather than push another out in turn. A reload brings it back.
    state.stream = null;
    return;
  }
  if (state.streamEnd) {
    // Ended by the server on purpose (its age limit, or the key's check): back at once;
    // the cards stay shown, and the ones on their way are re-read once it is open.
    state.streamFailures = 1;
    openStream();
    return;
  }
  // Ended (a server restart, a network blip): come back, a little later each time, and
  // re-read what may have changed meanwhile.
  const wait = STREAM_RETRY_MS[Math.min(state.streamFailures, STREAM_RETRY_MS.length - 1)];
  state.streamFailures += 1;
  setTimeout(() => { if (state.stream === controller) { openStream(); } }, wait);
}

function closeStream() {
  if (state.stream) state.stream.abort();
  state.stream = null;
  state.streamOpen = false;
}

function handleEvent(block) {
  let kind = "message";
  let data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("event: ")) kind = line.slice(7);
    else if (line.startsWith("data: ")) data += line.slice(6);
  }
  window.darkroomStats.events += 1;
  if (kind === "ping") { window.darkroomStats.pings += 1; return; }
  if (kind === "open") {
    const reread = state.streamFailures > 0 || state.shownBeforeOpen;
    state.streamFailures = 0;
    state.streamOpen = true;
    state.opens += 1;
    state.shownBeforeOpen = false;
    // Sent from here on, reads count as made after this `open`.
    if (reread) resync();
    const waiting = state.onOpen;
    state.onOpen = [];
    for (const fn of waiting) fn();
    return;
  }
  if (kind === "resync") { resync(); return; }
  if (kind === "end") { state.streamEnd = JSON.parse(data).reason || "end"; return; }
  if (kind !== "status") return;
  const event = JSON.parse(data);
  const entry = state.cards.get(event.id);
  if (event.status === "deleting") { removeCard(event.id); return; }
  const seq = noteChange(event.id, false);
  if (!entry) return;
  entry.changed = seq;
  if (FINAL.has(event.status)) {
    // One read for the card's result (its thumb, size or error), only when it ends.
    refreshCard(event.id);
  } else if (entry.el.dataset.status !== "uploading") {
    entry.card = { ...entry.card, status: event.status };
    setStatus(entry.el, event.status);
  }
}

// One read of card `id` at a time; asked again meanwhile, it is read once more after. An
// answer for a grid since emptied (another view, another key) is dropped.
async function refreshCard(id) {
  const inFlight = state.refreshing;  // this grid's: resetGrid starts another
  if (inFlight.has(id)) { inFlight.set(id, true); return; }
  const generation = state.generation;
  inFlight.set(id, false);
  try {
    const card = await api("GET", `/v1/files/${id}`);
    if (generation !== state.generation) return;
    render(card);
    const entry = state.cards.get(id);
    // Shown in a view it has left (the filter's status or code): the listing of this
    // view no longer holds it, so a re-read does not look for it there, until it is back.
    if (entry) entry.outOfView = !inView(card);
  } catch (error) {
    if (error.status === 404 && generation === state.generation) removeCard(id);
  } finally {
    window.darkroomStats.cardReads += 1;
    const again = inFlight.get(id);
    inFlight.delete(id);
    if (again && generation === state.generation) await refreshCard(id);
  }
}

function inView(card) {
  return (!state.filter || card.status === state.filter)
    && (!state.code || card.error_code === state.code);
}

// Changes may have been missed: read again what the page shows. The listing's pages it
// has loaded come first, one request each, and a few more while cards it shows are still
// to come (cards added above push them down), so that a card that left ready or rejected
// (deleted from another tab, re-derived, retried) is found as well as one on its way, and
// a card added among them is shown in its place; then, one by one, the cards the listing
// no longer holds (a 404 takes a card out), or, past REFRESH_AT_MOST of them, the grid is
// read anew. One re-read at a time; one asked for meanwhile runs once it ends.
async function resync() {
  if (state.resyncing) { state.resyncAgain = true; return; }
  state.resyncing = true;
  try {
    do {
      state.resyncAgain = false;
      await relist();
    } while (state.resyncAgain);
  } finally {
    state.resyncing = false;
    window.darkroomStats.rereads += 1;
  }
}

function isLocal(entry) {
  return entry.el.dataset.status === "uploading" || entry.el.dataset.status === "failed";
}

// A card as a listing holds it; this page's own upload in progress (or failed before its
// card was queued) is the upload flow's to draw.
function drawListed(card, sent, before = null) {
  const entry = state.cards.get(card.id);
  if (entry && isLocal(entry)) return;
  render(card, false, sent, before);
}

// A re-read whose listing failed (the server away a moment): tried again a little later,
// by one timer however many failed meanwhile.
function retryRelistLater(generation) {
  if (generation !== state.generation || state.relistRetry !== null) return;
  state.relistRetry = setTimeout(() => {
    state.relistRetry = null;
    if (state.streamOpen && generation === state.generation) resync();
  }, RELIST_RETRY_MS);
}

// The grid read again from its first page, this page's own uploads kept on top.
function readAnew() {
  resetGrid(true);
  loadPage();
}

// A card's created_at as the listing orders it: [whole seconds in ms, microseconds]
// (Date keeps milliseconds only; two cards may share one).
function createdKey(card) {
  const fraction = /\.(\d+)/.exec(card.created_at);
  const micros = fraction ? Number((fraction[1] + "000000").slice(0, 6)) : 0;
  return [Date.parse(card.created_at.replace(/\.\d+/, "")), micros];
}

// Whether card `a` comes before card `b` in a listing (newest first, then by id).
function listedBefore(a, b) {
  const [sa, ua] = createdKey(a);
  const [sb, ub] = createdKey(b);
  if (sa !== sb) return sa > sb;
  if (ua !== ub) return ua > ub;
  return a.id > b.id;
}

// The last card of the grid that its listing holds (not an upload of this page's own,
// not one that left the view).
function lastListed() {
  const grid = $(".grid").children;
  for (let i = grid.length - 1; i >= 0; i -= 1) {
    const entry = state.cards.get(grid[i].dataset.id);
    if (entry && !isLocal(entry) && !entry.outOfView) return entry;
  }
  return null;
}

async function relist() {
  const generation = state.generation;
  const expected = new Set();
  for (const [id, entry] of state.cards) if (!isLocal(entry) && !entry.outOfView) expected.add(id);
  const last = lastListed();
  if (last === null) {
    // Nothing listed shown (an empty view, or only this page's own uploads): its first
    // page, drawn as the grid's, once the grid's own first read has come (and none of
    // its reads is on its way, whose cursor this would cross).
    if (state.pagesLoaded === 0 || state.loading) return;
    try {
      const page = await api("GET", `/v1/files?${listQuery(null)}`);
      if (generation !== state.generation) return;
      for (const card of page.items) {
        const entry = state.cards.get(card.id);
        if (entry) entry.outOfView = false;  // back in the view's listing
        drawListed(card, page.__sent);
      }
      tookPage(page);
      updateEmpty();
    } catch (_) {
      retryRelistLater(generation);
    }
    return;
  }
  const seen = new Set();
  let newcomers = [];
  let cursor = null;
  // Read until past the last card shown (what follows it is scrolling's to bring), or
  // the listing's end.
  let passed = false;
  let sent;
  try {
    for (let i = 0; !passed && i < state.pagesLoaded + RELIST_EXTRA_PAGES; i += 1) {
      const page = await api("GET", `/v1/files?${listQuery(cursor)}`);
      if (generation !== state.generation) return;
      sent = page.__sent;
      for (const card of page.items) {
        if (!listedBefore(card, last.card) && card.id !== last.card.id) {
          passed = true;
          break;
        }
        seen.add(card.id);
        const entry = state.cards.get(card.id);
        if (!entry) { newcomers.push(card); continue; }
        entry.outOfView = false;
        for (const c of newcomers) drawListed(c, sent, entry.el);
        newcomers = [];
        drawListed(card, sent);
      }
      cursor = page.next_cursor;
      if (!cursor) passed = true;
    }
  } catch (_) {
    retryRelistLater(generation);
    return;
  }
  const missing = [...expected].filter((id) => !seen.has(id) && state.cards.has(id));
  // More cards were added above than the pages read could hold (the cards shown were not
  // all reached, and the new ones would never show: scrolling starts below them), or too
  // many are missing to look up one by one: the grid is read anew.
  if (!passed || missing.length > REFRESH_AT_MOST) {
    readAnew();
    return;
  }
  // Added among the cards shown after the last one met (that one gone since, say).
  const anchor = state.cards.get(last.card.id);
  for (const c of newcomers) drawListed(c, sent, anchor ? anchor.el : null);
  for (const id of missing) {
    if (generation !== state.generation) return;
    // Every owner's view (an admin's) cannot read another owner's card alone: one its
    // listing no longer holds has left the view.
    if (state.allOwners) {
      const entry = state.cards.get(id);
      if (entry) entry.outOfView = true;
      continue;
    }
    await refreshCard(id);
  }
}

// --- viewer ------------------------------------------------------------------------------

async function openViewer(card) {
  const dialog = $('[data-testid="viewer"]');
  const img = $('[data-testid="viewer-image"]', dialog);
  if (img.src.startsWith("blob:")) URL.revokeObjectURL(img.src);
  img.removeAttribute("src");
  img.hidden = true;
  $('[data-testid="viewer-name"]', dialog).textContent = card.filename;
  const details = [
    ["Status", STATUS_LABEL[card.status] || card.status],
    ["Uploaded", new Date(card.created_at).toLocaleString()],
    ["Original", `${formatBytes(card.size)} · ${card.content_type}`],
    ["Attempts", String(card.attempts)],
  ];
  if (card.derivative) {
    details.push(["Preview", `${card.derivative.width}×${card.derivative.height} · ${formatBytes(card.derivative.bytes)} WebP`]);
  }
  $('[data-testid="viewer-details"]', dialog).replaceChildren(...details.map(([k, v]) => {
    const row = document.createElement("div");
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = k;
    dd.textContent = v;
    row.append(dt, dd);
    return row;
  }));
  const error = $('[data-testid="viewer-error"]', dialog);
  error.hidden = card.status !== "rejected";
  error.textContent = card.status === "rejected"
    ? (ERROR_TEXT[card.error_code] || ERROR_TEXT.processing_failed) : "";
  const del = $('[data-testid="viewer-delete"]', dialog);
  // Another owner's card (the console's view) is not this key's to delete.
  del.hidden = state.allOwners;
  del.onclick = async () => {
    if (await deleteCard(card.id)) dialog.close();
  };
  if (!dialog.open) dialog.showModal();
  loadHistory(card.id);
  if (card.status === "ready" && card.derivative) {
    try {
      // The one the user asked for: ahead of any thumb still waiting for a connection.
      const response = await fetch(card.derivative.url, { headers: authHeaders(), priority: "high" });
      if (!response.ok) throw new ApiError(response.status, null);
      const url = URL.createObjectURL(await response.blob());
      img.onload = () => { img.hidden = false; };
      img.alt = card.filename;
      img.src = url;
    } catch (_) {
      error.hidden = false;
      error.textContent = "The preview could not be loaded.";
    }
  }
}

// What each step of a card's history means, in words; a kind not listed shows as it is.
const EVENT_TEXT = {
  claimed: "Started", ready: "Finished", retry_scheduled: "Failed; will be tried again",
  rejected: "Rejected", exhausted: "Given up", deferred: "Handed back: storage unavailable",
  released: "Handed back: worker stopping", lease_lost: "Worker lost it; taken over",
  revoked: "Deleted", expired: "Upload never finished", rederive: "Queued to be made again",
  rederive_failed: "Making it again failed; the previous version is kept",
  retried: "Queued again after a rejection",
};
const HISTORY_SHOWN = 30;
const HISTORY_PAGES = 10;

// The card's steps (GET /v1/files/{id}/events, oldest first): the latest few are shown.
async function loadHistory(id) {
  const list = $('[data-testid="viewer-history"]');
  const more = $('[data-testid="viewer-history-more"]');
  list.replaceChildren();
  list.dataset.for = id;
  list.dataset.loaded = "";
  more.hidden = true;
  const events = [];
  let cursor = null;
  try {
    for (let page = 0; page < HISTORY_PAGES; page++) {
      const query = new URLSearchParams({ limit: "100" });
      if (cursor) query.set("cursor", cursor);
      const answer = await api("GET", `/v1/files/${id}/events?${query}`);
      events.push(...answer.items);
      cursor = answer.next_cursor;
      if (!cursor) break;
    }
  } catch (_) {
    if (list.dataset.for !== id) return;
    more.hidden = false;
    more.textContent = "The history could not be loaded.";
    return;
  }
  if (list.dataset.for !== id) return;  // another card was opened meanwhile
  const shown = events.slice(-HISTORY_SHOWN);
  list.replaceChildren(...shown.map((e) => {
    const li = document.createElement("li");
    li.dataset.kind = e.kind;
    const when = document.createElement("time");
    when.dateTime = e.at;
    when.textContent = new Date(e.at).toLocaleTimeString();
    const what = document.createElement("span");
    what.className = "what";
    what.textContent = EVENT_TEXT[e.kind] || e.kind;
    const facts = [];
    if (e.attempt !== null) facts.push(`attempt ${e.attempt}`);
    if (e.duration_seconds !== null) facts.push(`took ${e.duration_seconds.toFixed(1)} s`);
    if (e.error_code) facts.push(e.error_code);
    if (e.worker) facts.push(e.worker);
    const detail = document.createElement("span");
    detail.className = "facts";
    detail.textContent = facts.join(" · ");  // worker names and codes are data, never markup
    li.append(when, what, detail);
    return li;
  }));
  list.dataset.loaded = "1";
  if (events.length > shown.length || cursor) {
    more.hidden = false;
    more.textContent = `Earlier steps are not shown (darkroom show ${id}).`;
  } else if (!events.length) {
    more.hidden = false;
    more.textContent = "Nothing has happened to this file yet.";
  }
}

// --- upload ------------------------------------------------------------------------------

function typeOf(file) {
  const declared = (file.type || "").toLowerCase();
  if (ACCEPTED.includes(declared)) return declared;
  const ext = (file.name.split(".").pop() || "").toLowerCase();
  return BY_EXTENSION[ext] || declared;
}

function updateOverall() {
  const u = state.uploads;
  const box = $('[data-testid="upload-progress"]');
  if (u.files === 0) { box.hidden = true; return; }
  box.hidden = false;
  const fraction = u.total ? u.sent / u.total : 1;
  $("span", $('[data-testid="upload-bar"]')).style.width = `${Math.round(fraction * 100)}%`;
  $('[data-testid="upload-text"]').textContent =
    `Uploading ${u.done} of ${u.files} files · ${Math.round(fraction * 100)}%`;
  if (u.done === u.files && u.running === 0) {
    $('[data-testid="upload-text"]').textContent = `Uploaded ${u.files} file${u.files === 1 ? "" : "s"}`;
    u.files = u.done = u.total = u.sent = 0;
  }
}

// A file refused before it became a card gets a local card, with a retry where one helps.
function localFailure(file, message) {
  const el = newCardElement(file.name, true);
  setStatus(el, "failed");
  setError(el, message);
  $('[data-testid="delete"]', el).addEventListener("click", () => { el.remove(); updateEmpty(); });
  return el;
}

function showRetry(el, onRetry) {
  const button = $('[data-testid="retry"]', el);
  button.hidden = !onRetry;
  button.onclick = onRetry ? (e) => { e.stopPropagation(); button.hidden = true; onRetry(); } : null;
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

async function putOriginal(card, file, type, progress) {
  try {
    return await putWithProgress(card.upload, file, progress);
  } catch (error) {
    // A direct-to-store upload the browser could not complete or read (typically the
    // bucket's CORS): send the bytes through the API instead.
    if (error.status !== 0 || sameOrigin(card.upload.url)) throw error;
    const viaApi = { method: "PUT", url: `/v1/files/${card.id}/content`, headers: { "Content-Type": type } };
    return putWithProgress(viaApi, file, progress);
  }
}

// One upload: its Idempotency-Key is made once per dropped file and kept for every retry,
// automatic or by the Retry button, so no retry can make a second card. `counted` is the
// batch whose overall progress this file's bytes add to.
async function uploadFile(file, counted, job = { key: randomKey(), sha256: undefined, local: null }) {
  const type = typeOf(file);
  if (!ACCEPTED.includes(type)) {
    localFailure(file, ERROR_TEXT.unsupported_format);
    return;
  }
  if (job.sha256 === undefined) job.sha256 = await sha256Hex(file);
  const body = { filename: file.name, content_type: type, size: file.size };
  if (job.sha256) body.sha256 = job.sha256;
  let card;
  try {
    card = await withRetries(() => api("POST", "/v1/files", body, { "Idempotency-Key": job.key }));
  } catch (error) {
    // Refusals (format, size, quota) will not change on a retry: no Retry button for them.
    job.local = localFailure(file, apiErrorText(error));
    if (transient(error)) {
      showRetry(job.local, () => { job.local.remove(); queueUpload(file, job); });
    }
    return;
  }
  if (!card.upload) {
    // Nothing to upload: the archive has these bytes (`duplicate_of`), or an earlier try
    // with this key already finished.
    const shown = state.cards.has(card.id);
    render(card, true);
    const el = cardElement(card.id);
    showRetry(el, null);
    if (card.duplicate_of) {
      setNote(el, `“${file.name}” is already in your archive, so it was not uploaded again.`);
      if (shown) el.scrollIntoView({ block: "nearest" });
    }
    return;
  }
  render(card, true);
  const el = cardElement(card.id);
  showRetry(el, null);
  setError(el, "");
  setStatus(el, "uploading");
  setProgress(el, 0);
  let reported = 0;
  const progress = (f) => {
    setProgress(el, f);
    const now = f * file.size;
    counted.sent += now - reported;
    reported = now;
    updateOverall();
  };
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
      const version = await withRetries(() => putOriginal(card, file, type, progress));
      progress(1);
      confirmed = await withRetries(() => api("POST", `/v1/files/${card.id}/confirm`, { version }));
    }
    progress(1);
    render(confirmed);
  } catch (error) {
    setProgress(el, null);
    setStatus(el, "failed");
    setError(el, apiErrorText(error));
    showRetry(el, () => queueUpload(file, job));
  }
}

function queueUpload(file, job = undefined) {
  const u = state.uploads;
  u.files += 1;
  u.total += file.size;
  u.waiting.push({ file, job });
  updateOverall();
  pump();
}

function pump() {
  const u = state.uploads;
  while (u.running < UPLOADS_AT_ONCE && u.waiting.length) {
    const { file, job } = u.waiting.shift();
    u.running += 1;
    uploadFile(file, u, job).finally(() => {
      u.running -= 1;
      u.done += 1;
      updateOverall();
      pump();
    });
  }
}

function uploadAll(files) {
  if (!state.key) { showNotice("Enter your API key first."); return; }
  for (const file of files) queueUpload(file);
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
    renderPauses(s.claim_pauses || []);
    renderPauseLog((s.claim_pause_log || [])[0]);
    renderCodes(s.rejected_by_code || {});
    state.admin = true;
    panel.hidden = false;
  } catch (error) {
    if (error.status === 403 || error.status === 401) {
      state.admin = false;
      panel.hidden = true;
      stopQueue();
      return;
    }
    // Anything else is passing: keep the panel and try again at the next tick.
  }
}

function pauseScope(p) {
  const parts = [];
  if (p.owner) parts.push(`owner ${p.owner}`);
  if (p.priority) parts.push(`${p.priority} files`);
  return parts.length ? parts.join(", ") : "every file";
}

function consoleError(message) {
  const p = $('[data-testid="q-console-error"]');
  p.hidden = !message;
  p.textContent = message || "";
}

// An operator's pauses of claiming, each with its own Resume (which lifts exactly it).
function renderPauses(pauses) {
  const badge = $('[data-testid="q-claiming"]');
  badge.textContent = pauses.length ? "paused" : "running";
  badge.dataset.status = pauses.length ? "rejected" : "ready";
  $('[data-testid="q-pauses"]').replaceChildren(...pauses.map((p) => {
    const li = document.createElement("li");
    li.dataset.owner = p.owner || "";
    li.dataset.priority = p.priority || "";
    const text = document.createElement("span");
    text.textContent = `${pauseScope(p)} · by ${p.paused_by} since ${new Date(p.since).toLocaleTimeString()}`;
    const resume = document.createElement("button");
    resume.type = "button";
    resume.dataset.testid = "q-resume";
    resume.textContent = "Resume";
    resume.addEventListener("click", () => changePause("resume", { owner: p.owner, priority: p.priority }, resume));
    li.append(text, resume);
    return li;
  }));
}

// The latest pause or resume, and who asked for it.
function renderPauseLog(last) {
  const p = $('[data-testid="q-pause-log"]');
  p.hidden = !last;
  p.textContent = last
    ? `Last: ${last.kind} ${pauseScope(last)} by ${last.actor} at ${new Date(last.at).toLocaleTimeString()}`
    : "";
}

async function changePause(action, scope, button) {
  const body = {};
  if (scope.owner) body.owner = scope.owner;
  if (scope.priority) body.priority = scope.priority;
  button.disabled = true;
  try {
    // Both are safe to repeat: a pause already in force, or one already lifted, is a no-op.
    await withRetries(() => api("POST", `/v1/queue/${action}`, body));
    consoleError("");
    return true;
  } catch (_) {
    consoleError(`The ${action} did not go through. Please try again.`);
    return false;
  } finally {
    button.disabled = false;
    refreshQueue();
  }
}

// Rejected files by code: each opens the grid on every owner's rejected files of that code.
function renderCodes(byCode) {
  const items = Object.entries(byCode).map(([code, n]) => {
    const li = document.createElement("li");
    const link = document.createElement("button");
    link.type = "button";
    link.className = "link";
    link.dataset.code = code;
    link.dataset.testid = "q-code";
    link.textContent = `${code} · ${n}`;
    link.title = ERROR_TEXT[code] || code;
    link.addEventListener("click", () => showRejected(code));
    li.append(link);
    return li;
  });
  if (!items.length) {
    const li = document.createElement("li");
    li.textContent = "none";
    items.push(li);
  }
  $('[data-testid="q-rejected-codes"]').replaceChildren(...items);
}

// The grid on one code's rejected files; for an admin, every owner's, to be picked and
// retried when the code is one a retry helps.
function showRejected(code) {
  state.filter = "rejected";
  state.code = code;
  state.allOwners = state.admin;
  $('[data-testid="status-filter"]').value = "rejected";
  const chip = $('[data-testid="code-filter"]');
  chip.hidden = false;
  $('[data-testid="code-filter-text"]').textContent =
    `Rejected with ${code}${state.allOwners ? ", every owner's" : ""}`;
  $(".grid").dataset.scope = state.allOwners ? "all" : "";
  $('[data-testid="retry-result"]').textContent = "";
  resetGrid();
  updatePicking();
  loadPage();
}

function clearCodeFilter() {
  state.code = "";
  state.allOwners = false;
  $('[data-testid="code-filter"]').hidden = true;
  $('[data-testid="picking"]').hidden = true;
  $(".grid").dataset.scope = "";
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
  state.admin = false;
  clearCodeFilter();
  localStorage.removeItem(KEY_STORAGE);
  stopQueue();
  closeStream();
  resetGrid();
  updateEmpty();
  $('[data-testid="queue-panel"]').hidden = true;
  $('[data-testid="key-form"]').hidden = false;
  $('[data-testid="key-set"]').hidden = true;
  if (clearNotice) showNotice("");
}

function useKey(key) {
  state.key = key;
  clearCodeFilter();
  localStorage.setItem(KEY_STORAGE, key);
  $('[data-testid="key-form"]').hidden = true;
  $('[data-testid="key-set"]').hidden = false;
  $('[data-testid="key-hint"]').textContent = `${key.slice(0, 6)}…${key.slice(-4)}`;
  showNotice("");
  resetGrid();
  openStream();
  whenStreamOpen(loadPage);
  startQueue();
}

// A grid's first read waits (a little) for its live stream's `open`: read after it, it
// misses no change and needs no second read (answeredBeforeOpen).
function whenStreamOpen(fn) {
  if (state.streamOpen || !state.stream) { fn(); return; }
  let done = false;
  const once = () => { if (!done) { done = true; fn(); } };
  state.onOpen.push(once);
  setTimeout(once, OPEN_WAIT_MS);
}

// --- wiring ------------------------------------------------------------------------------

function init() {
  state.thumbs = new IntersectionObserver((entries) => {
    for (const e of entries) {
      e.target.dataset.visible = e.isIntersecting ? "1" : "";
      const id = e.target.dataset.id;
      if (!id) continue;
      if (e.isIntersecting) wantThumb(id);
      else state.thumbsWanted.delete(id);
    }
  }, { rootMargin: "400px 0px" });
  new IntersectionObserver((entries) => {
    if (entries.some((e) => e.isIntersecting)) loadPage();
  }, { rootMargin: "800px 0px" }).observe($('[data-testid="more"]'));

  $('[data-testid="key-form"]').addEventListener("submit", (e) => {
    e.preventDefault();
    const key = $('[data-testid="key-input"]').value.trim();
    if (key) { $('[data-testid="key-input"]').value = ""; useKey(key); }
  });
  $('[data-testid="key-forget"]').addEventListener("click", () => forgetKey());

  $('[data-testid="status-filter"]').addEventListener("change", (e) => {
    clearCodeFilter();
    state.filter = e.target.value;
    resetGrid();
    loadPage();
  });

  $('[data-testid="pick-all"]').addEventListener("change", (e) => {
    for (const entry of pickable()) $('[data-testid="pick"]', entry.el).checked = e.target.checked;
    updatePicking();
  });
  $('[data-testid="retry-selected"]').addEventListener("click", () => retryChosen("selected"));
  $('[data-testid="retry-shown"]').addEventListener("click", () => retryChosen("all"));
  $('[data-testid="code-filter-clear"]').addEventListener("click", () => {
    clearCodeFilter();
    state.filter = "";
    $('[data-testid="status-filter"]').value = "";
    resetGrid();
    loadPage();
  });
  $('[data-testid="q-pause-form"]').addEventListener("submit", (e) => {
    e.preventDefault();
    const owner = $('[data-testid="q-pause-owner"]').value.trim();
    const priority = $('[data-testid="q-pause-priority"]').value;
    changePause("pause", { owner, priority }, $('[data-testid="q-pause"]'))
      .then((done) => { if (done) $('[data-testid="q-pause-owner"]').value = ""; });
  });

  const dialog = $('[data-testid="viewer"]');
  $('[data-testid="viewer-close"]').addEventListener("click", () => dialog.close());
  dialog.addEventListener("click", (e) => { if (e.target === dialog) dialog.close(); });

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

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
else init();
