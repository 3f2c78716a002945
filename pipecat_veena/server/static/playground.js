// The playground: voices from GET /v1/audio/voices, speech over the server's streaming
// WebSocket (docs/protocol.md), played as it arrives by player-worklet.js in an AudioContext
// that runs at the stream's sample rate (the browser resamples to the device), with a live
// waveform and the figures of the utterance in flight: time to the first sound played,
// real-time factor, underruns (and why playback stutters), and the text with the word being
// played highlighted (the server's word timings, followed on the AudioContext's clock). The
// page watches its connection and
// redials with backoff when the server goes away. Everything is fetched from the server that
// served this page.

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = "pipecat-veena.api_key";
const STREAM_PATH = "/v1/audio/stream";
const WORKLET = "/playground/player-worklet.js";
// Audio held before playback starts (the player doubles it after each underrun). An answer
// that ran dry teaches the next ones to start later by its deficit (the longest the player
// waited dry), up to LEARNT_MAX_S: a jitter buffer that learns how far behind this server's
// first chunks come. CLEAN_TO_SHRINK answers in a row without an underrun halve it again, down
// to PREBUFFER_S.
const PREBUFFER_S = 0.1;
const LEARNT_MAX_S = 0.5;
const CLEAN_TO_SHRINK = 3;
const AUDIO_FRAME = 0x01;
const RECONNECT_S = [1, 15]; // first and longest wait before redialling (doubling, jittered)
const HEALTH_EVERY_S = 5; // how often a connected page checks /health (a server gone silently)
const HEALTH_TIMEOUT_S = 3;
const TINY_DEMO = "spark-tiny"; // the demo checkpoint that keeps up on a CPU
const TINY_DEMO_PATH = `~/.cache/pipecat_veena/demo/${TINY_DEMO}`;
// What the WebSocket's close codes mean, in words (docs/protocol.md: Lifecycle).
const CLOSE_WORDS = {
  1000: "the server closed the connection",
  1001: "the server is going away (shutting down or restarting)",
  1006: "the server stopped or the network dropped",
  1008: "the server refused the connection (API key)",
  1009: "a message was too large for the server",
  1011: "the server hit an internal error",
  1012: "the server is restarting",
  1013: "the server is busy, starting or shutting down",
};
// What a done message's warning means (docs/protocol.md: done).
const WARNINGS = {
  nothing_to_speak: [
    "nothing to speak",
    "The server found nothing to speak in this text: no letters or digits outside emoji, " +
      "symbols and markup. Type words or numbers.",
  ],
  loop_guard: [
    "cut short: looping",
    "The server cut this utterance short: the model started repeating itself (loop guard). " +
      "Try another seed or a higher temperature.",
  ],
  token_cap: [
    "cut short: token cap",
    "The server cut this utterance short: the model reached its cap on tokens for the text's " +
      "length. Try another seed, or shorter sentences.",
  ],
};
const INSECURE =
  "Browsers play streamed audio (an AudioWorklet) only on pages served over HTTPS or from " +
  "localhost: put the server behind TLS, or open it through a tunnel " +
  "(ssh -L 8000:localhost:8000 tts-host, then this page on localhost:8000).";

const EXAMPLES = [
  ["Hindi: an OTP", "आपका OTP 482913 है। इसे किसी के साथ साझा न करें।"],
  ["Hindi: an amount and a date", "आपका बिल ₹12,345.50 है, जिसे 15/08/2025 तक भरना है।"],
  ["Hindi and English: an order", "नमस्ते! आपका order 3 दिन में deliver होगा।"],
  ["English: a payment", "Your payment of ₹1,499 was received on 15/08/2025. Thank you!"],
  ["English: an OTP and a number", "Your OTP is 482913. For help, call 98765 43210."],
  [
    "Hindi: a long answer (try Stop)",
    "नमस्ते! आपका order आज सुबह ship हो गया है। यह 3 दिन में आपके घर पहुँच जाएगा। " +
      "आपका बिल ₹2,499 है और आप इसे delivery के समय भी दे सकते हैं। " +
      "किसी भी सवाल के लिए हमें 1800 123 4567 पर call करें। धन्यवाद!",
  ],
];

// What the page knows; the browser tests read it too (window.playground).
const page = {
  voices: null, // the answer of GET /v1/audio/voices
  ready: null, // the WebSocket's ready message
  utterance: null, // the utterance in flight or last spoken (see newUtterance)
  message: null, // the message shown to the user, if any
  failure: null, // the last error that closed the WebSocket ({code, message}), if any
  // connecting, connected, idle (closed for inactivity: redialled at the next Speak),
  // key_needed, key_refused, unreachable (redialling with backoff)
  connection: "connecting",
  hint: null, // why playback stutters, when it does
  enrolled: null, // the last voice enrolled from this page (POST /v1/audio/voices), if any
  enrolResult: null, // what the voice section last said: {text, kind}
  source: null, // what Enrol sends: "recording", "file" or null (nothing yet)
  prebuffer: PREBUFFER_S, // seconds of audio the next answer waits for before it plays
  cleanAnswers: 0, // answers in a row that played without an underrun
};
window.playground = page;

let socket = null; // {ws, ready: Promise of the ready message, failure: the error before close}
let audio = null; // {rate, ctx, analyser, node, loaded: Promise}
let sequence = 0;
let redial = { attempt: 0, timer: null };
let speaking = false; // a Speak click is being handled (the button keeps its focus)

// -- messages and the API key -------------------------------------------------------------
// A message to the user: kind "error" (the default), "warning", "info" or "success", each
// styled apart (playground.css).
function showMessage(text, kind = "error") {
  page.message = text;
  showIn($("message"), text, kind);
}

// What the voice section says (enrol, delete, recording), shown next to its controls so that it
// is in view where the user clicked, on a phone too.
function showEnrolResult(text, kind = "error") {
  page.enrolResult = text ? { text, kind } : null;
  showIn($("enrol-result"), text, kind);
  if (text) $("enrol-result").scrollIntoView({ block: "nearest" });
}

function showIn(element, text, kind) {
  element.textContent = text;
  element.dataset.kind = kind;
  element.setAttribute("role", kind === "error" ? "alert" : "status");
  element.hidden = !text;
}

// An HTTP error answer as {code, message}: the server's own error object, or plain words for
// an answer without one (a proxy's page): never the raw body.
const HTTP_WORDS = {
  413: "the file is larger than this server accepts",
  429: "the server is busy with other uploads: try again in a few seconds",
  502: "the server is not available right now",
  503: "the server is not available right now",
  504: "the server did not answer in time",
};

function httpError(response, body) {
  const error = body && body.error;
  if (error && typeof error.message === "string" && error.message) return error;
  const words = HTTP_WORDS[response.status] || `the server answered HTTP ${response.status}`;
  return { code: `http_${response.status}`, message: words };
}

function apiKey() {
  return localStorage.getItem(KEY_STORAGE) || "";
}

function authHeaders() {
  const key = apiKey();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

function describe(error) {
  if (error.code !== "unauthorized") return error.message;
  $("key").focus();
  setConnection(apiKey() ? "key_refused" : "key_needed");
  return apiKey()
    ? `The server did not accept this API key: check it in the API key field. (${error.message})`
    : "This server needs an API key: enter it in the API key field above. " +
        `(${error.message})`;
}

function closeWords(code) {
  return CLOSE_WORDS[code] || `the connection closed (code ${code})`;
}

// -- the connection's state, in the header ------------------------------------------------
const CONNECTION_TEXT = {
  connecting: "Connecting to the speech server…",
  key_needed: "API key needed: this server has keys; enter yours in the API key field.",
  key_refused: "API key refused: the server did not accept it; check the API key field.",
  unreachable: "Server unreachable, reconnecting…",
};

function setConnection(state, text = CONNECTION_TEXT[state]) {
  page.connection = state;
  $("model").dataset.state = state;
  if (text) $("model").textContent = text;
}

// The server went away: say so and redial, waiting longer each time (with jitter, so many
// pages do not come back at once).
function unreachable(why) {
  setConnection("unreachable");
  showMessage(`${why}. Reconnecting…`);
  if (redial.timer) return;
  const [first, longest] = RECONNECT_S;
  const wait = Math.min(longest, first * 2 ** redial.attempt) * (0.5 + 0.5 * Math.random());
  redial.attempt += 1;
  $("model").textContent = `Server unreachable, reconnecting in ${Math.ceil(wait)} s…`;
  redial.timer = setTimeout(() => {
    redial.timer = null;
    refresh();
  }, wait * 1000);
}

async function watchHealth() {
  if (page.connection !== "connected" && page.connection !== "idle") return;
  try {
    const signal = AbortSignal.timeout(HEALTH_TIMEOUT_S * 1000);
    const response = await fetch("/health", { signal });
    if (response.ok || response.status === 503) return; // 503: up, starting or draining
    throw new Error(`HTTP ${response.status}`);
  } catch {
    if (page.connection !== "connected" && page.connection !== "idle") return;
    disconnect();
    unreachable("The speech server does not answer");
  }
}

// -- voices ------------------------------------------------------------------------------
async function loadVoices() {
  let response;
  try {
    response = await fetch("/v1/audio/voices", { headers: authHeaders() });
  } catch {
    unreachable("The speech server does not answer");
    return false;
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = httpError(response, body);
    showVoices(null); // (a refused key sees none of the voices of the key before)
    if (response.status === 503 && error.code === "server_starting") {
      showMessage("The engine is still loading; this page retries every 2 s.", "info");
      setTimeout(refresh, 2000);
    } else {
      showMessage(describe(error));
    }
    return false;
  }
  showVoices(body);
  $("demo").hidden = !body.demo;
  setConnection("connecting", `${body.model} · ${body.voices.length} voices`);
  return true;
}

// The voices the caller may delete (GET /v1/audio/voices: "owned", its own enrolled voices).
function ownedVoices() {
  return (page.voices && page.voices.owned) || [];
}

// The Voice list (keeping the choice where it is still there) and "Your voices", each with
// its Delete button; `voices` null: none (the key was refused).
function showVoices(voices) {
  page.voices = voices;
  const select = $("voice");
  const chosen = select.value;
  const names = voices ? voices.voices : [];
  const owned = ownedVoices();
  select.replaceChildren(
    ...names.map((name) => new Option(owned.includes(name) ? `${name} (yours)` : name, name)),
  );
  if (voices) select.value = names.includes(chosen) ? chosen : voices.default;
  const items = owned.map((name) => {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "delete";
    button.textContent = "Delete";
    button.dataset.voice = name;
    button.setAttribute("aria-label", `Delete voice ${name}`);
    button.onclick = () => deleteVoice(name);
    const label = document.createElement("span");
    label.textContent = name;
    const item = document.createElement("li");
    item.append(label, button);
    return item;
  });
  $("owned").replaceChildren(...items);
  $("no-voices").hidden = owned.length > 0;
}

// -- the WebSocket -----------------------------------------------------------------------
function streamUrl() {
  const url = new URL(STREAM_PATH, location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  // Browsers cannot set headers on a WebSocket: the protocol takes the key in the URL.
  if (apiKey()) url.searchParams.set("api_key", apiKey());
  return url.href;
}

function connect() {
  if (socket) return socket.ready;
  const ws = new WebSocket(streamUrl());
  ws.binaryType = "arraybuffer";
  const s = { ws, failure: null };
  s.ready = new Promise((resolve, reject) => Object.assign(s, { resolve, reject }));
  s.ready.catch(() => {}); // each caller handles the failure
  ws.onmessage = (event) =>
    typeof event.data === "string" ? onMessage(s, JSON.parse(event.data)) : onAudio(event.data);
  ws.onclose = (event) => onClose(s, event);
  socket = s;
  return s.ready;
}

function disconnect() {
  if (socket) {
    socket.closedByPage = true;
    socket.ws.close();
  }
  socket = null;
}

function onMessage(s, msg) {
  const u = page.utterance;
  if (msg.type === "ready") {
    page.ready = msg;
    redial.attempt = 0;
    setConnection(
      "connected",
      `${msg.model} · ${msg.sample_rate} Hz · voices: ${msg.voices.join(", ")}`,
    );
    s.resolve(msg);
  } else if (msg.type === "done" && u && msg.id === u.id) {
    u.done = msg;
    u.state = msg.reason === "cancelled" ? "cancelled" : "completed";
    post({ type: "end" });
    if (WARNINGS[msg.warning]) showMessage(WARNINGS[msg.warning][1], "warning");
  } else if (msg.type === "words" && u && msg.id === u.id) {
    u.words.push(...msg.words);
    showTranscript(u);
  } else if (msg.type === "error" && u && msg.id === u.id && msg.ended) {
    u.state = "failed";
    u.error = msg;
    post({ type: "end" });
    showMessage(describe(msg));
  } else if (msg.type === "error" && !msg.id) {
    s.failure = page.failure = msg; // a connection error: the server closes next
  } else if (msg.type === "error") {
    showMessage(describe(msg));
  }
  render();
}

function onClose(s, event) {
  if (socket === s) socket = null;
  const failure = s.failure;
  const lost = !s.closedByPage && !failure && event.code !== 1008;
  const why = failure
    ? describe(failure)
    : `Lost the connection to the speech server: ${closeWords(event.code)}`;
  s.reject(new Error(why));
  const u = page.utterance;
  if (u && (u.state === "speaking" || u.state === "stopping")) {
    u.state = "failed";
    u.error = { code: "closed", message: why };
    post({ type: "end" });
    showMessage(why);
  } else if (failure && failure.code !== "idle_timeout") {
    showMessage(why);
  }
  if (failure?.code === "idle_timeout") setConnection("idle", null);
  else if (lost || (failure && failure.code !== "unauthorized")) unreachable(why);
  else if (event.code === 1008 && !failure) describe({ code: "unauthorized", message: why });
  render();
}

// One binary frame: kind, id length N, id, uint32 LLM tokens, then int16 LE mono PCM.
function onAudio(buffer) {
  const bytes = new Uint8Array(buffer);
  if (bytes.length < 2 || bytes[0] !== AUDIO_FRAME) return;
  const n = bytes[1];
  const id = String.fromCharCode(...bytes.subarray(2, 2 + n));
  const u = page.utterance;
  if (!u || id !== u.id || u.state !== "speaking") return; // late frames of a stopped one
  const view = new DataView(buffer);
  const start = 2 + n + 4;
  const count = (buffer.byteLength - start) >> 1;
  const samples = new Float32Array(count);
  let peak = u.peak;
  for (let i = 0; i < count; i++) {
    const v = view.getInt16(start + 2 * i, true) / 32768;
    samples[i] = v;
    peak = Math.max(peak, Math.abs(v));
  }
  const now = performance.now() - u.sentAt;
  if (u.firstAudioMs === null) u.firstAudioMs = now;
  u.lastAudioMs = now;
  u.tokens = view.getUint32(2 + n, true);
  u.frames += 1;
  u.samples += count;
  u.peak = peak;
  u.rtf = now / 1000 / (u.samples / u.sampleRate);
  post({ type: "pcm", samples }, [samples.buffer]);
  render();
}

// -- audio -------------------------------------------------------------------------------
// An AudioContext at the stream's rate (created in the click that asks for it, so it may
// play), the player worklet, and an analyser for the waveform.
function ensureAudio(rate) {
  if (!window.isSecureContext || !window.AudioWorkletNode) {
    return Promise.reject(new Error(INSECURE));
  }
  if (audio && audio.rate === rate) {
    audio.ctx.resume();
    return audio.loaded;
  }
  if (audio) audio.ctx.close();
  let ctx;
  try {
    ctx = new AudioContext({ sampleRate: rate, latencyHint: "interactive" });
  } catch {
    ctx = new AudioContext({ latencyHint: "interactive" }); // the server resamples instead
  }
  const analyser = ctx.createAnalyser();
  analyser.fftSize = 2048;
  const current = { rate, ctx, analyser, node: null };
  current.loaded = ctx.audioWorklet.addModule(WORKLET).then(() => {
    const node = new AudioWorkletNode(ctx, "stream-player", {
      numberOfInputs: 0,
      outputChannelCount: [1],
    });
    node.port.onmessage = (event) => onPlayer(event.data);
    node.connect(analyser).connect(ctx.destination);
    current.node = node;
    return current;
  });
  audio = current;
  ctx.resume();
  return current.loaded;
}

function post(message, transfer = []) {
  const u = page.utterance;
  if (audio && audio.node && u) audio.node.port.postMessage({ ...message, stream: u.id }, transfer);
}

// When a time on the AudioContext's clock is (was) heard, on performance.now()'s clock.
function contextTimeToPage(ctx, time) {
  const stamp = ctx.getOutputTimestamp ? ctx.getOutputTimestamp() : null;
  if (stamp && stamp.performanceTime > 0) {
    return stamp.performanceTime + (time - stamp.contextTime) * 1000;
  }
  const latency = (ctx.baseLatency || 0) + (ctx.outputLatency || 0);
  return performance.now() + (time - ctx.currentTime + latency) * 1000;
}

function onPlayer(stats) {
  const u = page.utterance;
  if (!u || stats.stream !== u.id) return; // a report about an earlier utterance
  u.played = stats.played;
  u.buffered = stats.buffered;
  u.underruns = stats.underruns;
  if (stats.event === "underrun") u.underrunsAt.push(stats.played / u.sampleRate);
  u.playedAt = stats.at;
  if (u.firstSoundMs === null && stats.soundAt !== null) {
    u.firstSoundMs = contextTimeToPage(audio.ctx, stats.soundAt) - u.sentAt;
  }
  if (stats.event === "drained" || stats.event === "stopped") {
    u.playback = stats.event;
    learnPrebuffer(u, stats.deficit);
  } else u.playback = stats.playing ? "playing" : "waiting";
  render();
  followWords();
}

// After an answer has played: if it ran dry (on a slow CPU the first small chunks decode
// slower than they play), the next starts later by its deficit; once answers keep playing
// through, the prebuffer shrinks again.
function learnPrebuffer(u, deficit) {
  if (u.underruns) {
    const needed = Math.min(LEARNT_MAX_S, u.prebuffer + deficit);
    page.prebuffer = Math.max(page.prebuffer, needed);
    page.cleanAnswers = 0;
  } else if (++page.cleanAnswers >= CLEAN_TO_SHRINK && page.prebuffer > PREBUFFER_S) {
    page.prebuffer = Math.max(PREBUFFER_S, page.prebuffer / 2);
    page.cleanAnswers = 0;
  }
}

// -- speak and stop ----------------------------------------------------------------------
function readOptions() {
  const options = {};
  for (const [field, integer] of [["temperature", false], ["top_p", false], ["seed", true]]) {
    const input = $(field);
    if (input.value === "") continue;
    const value = input.valueAsNumber;
    if (!Number.isFinite(value) || (integer && !Number.isInteger(value))) {
      showMessage(`${field} must be ${integer ? "a whole number" : "a number"}, or empty.`);
      return null;
    }
    options[field] = value;
  }
  // Speed 0.5-2.0: the server stretches the audio keeping its pitch; 1 sends nothing.
  const speed = $("speed").valueAsNumber;
  if (Number.isFinite(speed) && speed !== 1) options.speed = speed;
  return options;
}

function showSpeed() {
  $("speed-value").textContent = `${$("speed").valueAsNumber.toFixed(2)}×`;
}

function newUtterance(id, rate, text) {
  return {
    id,
    text,
    sampleRate: rate,
    state: "speaking", // speaking, stopping, completed, cancelled, failed
    stopped: false, // the user pressed Stop (before all audio came, or while it still played)
    playback: "waiting", // waiting, playing, drained, stopped
    sentAt: performance.now(),
    firstAudioMs: null, // the first audio frame received
    firstSoundMs: null, // the first sample that is not silence played (what a listener hears)
    lastAudioMs: null,
    rtf: null,
    frames: 0,
    samples: 0,
    tokens: 0,
    peak: 0,
    played: 0,
    buffered: 0,
    underruns: 0,
    underrunsAt: [], // seconds of audio played when each underrun began
    prebuffer: page.prebuffer, // seconds of audio it waited for before it started to play
    playedAt: null, // when sample `played` plays, on the AudioContext's clock (the player's)
    // the server's word timings ({word, start, end, offset, offset_utf16}), as they come
    words: [],
    current: -1, // the word being played (an index into words), -1: none
    highlights: [], // each change of the word being played: {index, heard, played}
    done: null,
    error: null,
  };
}

async function speak() {
  if (speaking) return; // a click is being handled (the button stays enabled to keep focus)
  const text = $("text").value.trim();
  if (!text) return showMessage("Type some text to speak first.");
  const options = readOptions();
  if (options === null) return;
  showMessage("");
  stop();
  // Create the AudioContext in the click itself when the stream's rate is already known.
  if (page.ready) ensureAudio(page.ready.sample_rate).catch(() => {});
  speaking = true;
  $("speak").setAttribute("aria-busy", "true");
  try {
    const ready = await connect();
    const { ctx } = await ensureAudio(ready.sample_rate);
    const rate = ctx.sampleRate;
    const rates = ready.limits.sample_rates || [];
    if (rate !== ready.sample_rate && !rates.includes(rate)) {
      throw new Error(
        `This browser plays ${rate} Hz audio; the server sends ${ready.sample_rate} Hz or ` +
          `${rates.join(", ")} Hz.`,
      );
    }
    const id = `u${++sequence}`;
    const message = { type: "speak", id, text, voice: $("voice").value || null, options };
    if (rate !== ready.sample_rate) message.sample_rate = rate; // the server resamples
    if (ready.words) message.words = true; // word timings, to follow the words played
    page.utterance = newUtterance(id, rate, text);
    showTranscript(page.utterance);
    post({ type: "start", prebufferSeconds: page.utterance.prebuffer });
    socket.ws.send(JSON.stringify(message));
  } catch (e) {
    // (our own errors say what to do; a browser's own, as an AudioContext's, is not for users)
    const own = !(e instanceof DOMException);
    showMessage(own ? e.message : "This browser could not start playing audio.");
  } finally {
    speaking = false;
    $("speak").removeAttribute("aria-busy");
    render();
  }
}

function stop() {
  const u = page.utterance;
  if (!u) return;
  const playing = u.playback === "waiting" || u.playback === "playing";
  if (u.state === "speaking" || u.state === "stopping" || playing) u.stopped = true;
  if (u.state === "speaking" && socket) {
    u.state = "stopping";
    socket.ws.send(JSON.stringify({ type: "cancel", id: u.id }));
  }
  if (u.playback === "waiting" || u.playback === "playing") post({ type: "stop" });
  render();
}

// -- drawing -----------------------------------------------------------------------------
const seconds = (samples, u) => `${(samples / u.sampleRate).toFixed(2)} s`;

function stateText(u) {
  const warning = u.done && WARNINGS[u.done.warning];
  if (warning && u.done.warning === "nothing_to_speak") return warning[0];
  // Stop wins over what the server said after it: cancelled, or completed when all the audio
  // had already come (it was still playing)
  if (u.stopped && u.state !== "failed") return "stopped";
  if (u.state === "completed" && u.playback !== "drained") return "received, playing";
  if (warning) return `${warning[0]}: ${u.done.audio_seconds.toFixed(2)} s of audio`;
  if (u.state === "completed") return `done: ${u.done.audio_seconds.toFixed(2)} s of audio`;
  if (u.state === "failed") return `failed: ${u.error.code}`;
  return u.state;
}

function render() {
  const u = page.utterance;
  const busy = u && (u.state === "speaking" || u.playback === "playing");
  $("stop").disabled = !busy;
  if (!u) return;
  $("state").textContent = stateText(u);
  $("state").dataset.warning = (u.done && u.done.warning) || "";
  const ms = (value) => `${Math.round(value)} ms`;
  const waiting = busy ? "waiting…" : "–";
  $("ttfa").textContent = u.firstSoundMs !== null ? ms(u.firstSoundMs) : waiting;
  $("ttff").textContent = `first frame: ${u.firstAudioMs !== null ? ms(u.firstAudioMs) : "–"}`;
  $("rtf").textContent = u.rtf !== null ? u.rtf.toFixed(2) : "–";
  $("underruns").textContent = String(u.underruns);
  $("received").textContent = `${seconds(u.samples, u)} (${u.samples} samples)`;
  $("played").textContent = seconds(u.played, u);
  $("buffered").textContent = `${Math.round((1000 * u.buffered) / u.sampleRate)} ms`;
  showHint(stutterHint(u));
}

// Why playback stutters, in plain words (null while it does not).
function stutterHint(u) {
  if (!u.underruns || u.rtf === null) return null;
  const rtf = u.rtf.toFixed(2);
  const runs = u.underruns === 1 ? "once" : `${u.underruns} times`;
  if (u.rtf <= 1) {
    const next = Math.round(1000 * page.prebuffer);
    return (
      `Playback stalled ${runs} although the server kept up (real-time factor ${rtf}): ` +
      "the first audio, the network or this browser came late. The next answers wait for " +
      `${next} ms of audio before they play.`
    );
  }
  const model = page.voices ? page.voices.model : "";
  let fix = "Run the server on a GPU or with a smaller model to keep up.";
  if (page.voices && page.voices.demo && model !== TINY_DEMO) {
    fix =
      "On a CPU the default demo's real-size codec is slower than real time; start the " +
      `server with --model ${TINY_DEMO_PATH}, which keeps up.`;
  } else if (model === TINY_DEMO) {
    fix = "The small demo keeps up on an idle CPU: this machine is busy or slow.";
  }
  return (
    `Playback stutters: the player ran dry ${runs} because the server makes audio slower than ` +
    `it plays (real-time factor ${rtf}; above 1 is slower than real time). ${fix}`
  );
}

function showHint(text) {
  page.hint = text;
  $("hint").textContent = text || "";
  $("hint").hidden = !text;
}

// -- the word being played ------------------------------------------------------------------
// The text, each word the server timed in a span of its own (the rest as it was typed).
function showTranscript(u) {
  const parts = [];
  let at = 0;
  u.words.forEach((w, i) => {
    // offset_utf16 indexes the text as JavaScript does (an emoji is 2 there; offset counts
    // code points); a server without it: look for the word from where the last one ended.
    let start = w.offset_utf16 ?? w.offset;
    if (u.text.slice(start, start + w.word.length) !== w.word) start = u.text.indexOf(w.word, at);
    if (start < at) return;
    if (start > at) parts.push(document.createTextNode(u.text.slice(at, start)));
    const span = document.createElement("span");
    span.className = "word";
    span.dataset.index = String(i);
    span.textContent = w.word;
    parts.push(span);
    at = start + w.word.length;
  });
  parts.push(document.createTextNode(u.text.slice(at)));
  $("transcript").replaceChildren(...parts);
  $("transcript").hidden = false;
  followWords(true);
}

// Seconds of the utterance the listener hears now: where the player's last report put sample
// `played` on the AudioContext's clock, moved on to the time the output device plays now.
function heardSeconds(u) {
  if (!audio || u.playedAt === null) return 0;
  const ctx = audio.ctx;
  const stamp = ctx.getOutputTimestamp ? ctx.getOutputTimestamp() : null;
  const now =
    stamp && stamp.contextTime > 0
      ? stamp.contextTime
      : ctx.currentTime - (ctx.outputLatency || ctx.baseLatency || 0);
  let ahead = now - u.playedAt; // (negative: the last samples played are still on their way)
  if (u.playback !== "playing") ahead = Math.min(ahead, 0); // paused: the clock runs on
  const samples = Math.max(0, Math.min(u.played + u.buffered, u.played + ahead * u.sampleRate));
  return samples / u.sampleRate;
}

// Highlight the word being played (the last one whose start was heard) and dim those before
// (`redraw`: the spans are new, mark them even if the word is the same).
function followWords(redraw = false) {
  const u = page.utterance;
  if (!u || !u.words.length) return;
  const over = u.playback === "drained" || u.playback === "stopped";
  const heard = heardSeconds(u);
  let current = -1;
  if (!over && u.played > 0) {
    for (let i = 0; i < u.words.length && u.words[i].start <= heard; i++) current = i;
  }
  if (current === u.current && !redraw) return;
  if (current !== u.current) u.highlights.push({ index: current, heard, played: u.played });
  u.current = current;
  for (const span of $("transcript").querySelectorAll(".word")) {
    const i = Number(span.dataset.index);
    span.classList.toggle("current", i === current);
    span.classList.toggle("said", over ? heard >= u.words[i].start : i < current);
  }
}

function drawWave() {
  const canvas = $("wave");
  const width = Math.round(canvas.clientWidth * devicePixelRatio);
  const height = Math.round(canvas.clientHeight * devicePixelRatio);
  if (canvas.width !== width || canvas.height !== height) Object.assign(canvas, { width, height });
  const g = canvas.getContext("2d");
  g.clearRect(0, 0, width, height);
  g.strokeStyle = "#2f5bd3";
  g.lineWidth = devicePixelRatio;
  g.beginPath();
  const data = new Float32Array(audio ? audio.analyser.fftSize : 2);
  if (audio) audio.analyser.getFloatTimeDomainData(data);
  for (let i = 0; i < data.length; i++) {
    const x = (i / (data.length - 1)) * width;
    const y = (0.5 - 0.45 * Math.max(-1, Math.min(1, data[i]))) * height;
    if (i === 0) g.moveTo(x, y);
    else g.lineTo(x, y);
  }
  g.stroke();
  followWords();
  requestAnimationFrame(drawWave);
}

// -- your own voice: record (getUserMedia) or upload, then POST /v1/audio/voices -----------
let recorder = null; // {media: MediaRecorder, chunks: Blob[], startedAt} while recording
let recorded = null; // the last recording, a Blob
let recordedSeconds = 0;

const kb = (blob) => `${Math.max(1, Math.round(blob.size / 1024))} KB`;

// What the microphone's failure means, in words (never the browser's own exception text).
function microphoneTrouble(error) {
  if (error && error.name === "NotAllowedError") return "this page may not use the microphone";
  if (error && error.name === "NotFoundError") return "this device has no microphone";
  return "the microphone could not be opened";
}

async function toggleRecording() {
  if (recorder) {
    recorder.media.stop();
    return;
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (e) {
    showEnrolResult(`Cannot record: ${microphoneTrouble(e)}. Choose a file instead.`);
    return;
  }
  const media = new MediaRecorder(stream);
  recorder = { media, chunks: [], startedAt: performance.now() };
  media.ondataavailable = (event) => recorder && recorder.chunks.push(event.data);
  media.onstop = () => {
    stream.getTracks().forEach((track) => track.stop());
    recorded = new Blob(recorder.chunks, { type: media.mimeType });
    recordedSeconds = (performance.now() - recorder.startedAt) / 1000;
    recorder = null;
    $("record").textContent = "Record again";
    $("recording").textContent = `recorded ${recordedSeconds.toFixed(0)} s`;
    chooseSource("recording");
  };
  media.start();
  $("record").textContent = "Stop recording";
  $("recording").textContent = "recording… (speak for about 10 s)";
}

// Which clip Enrol sends: the latest one made or chosen, unless the user picks the other.
function chooseSource(source) {
  const file = $("clip").files[0] || null;
  if (source === "file" && !file) source = recorded ? "recording" : null;
  if (source === "recording" && !recorded) source = file ? "file" : null;
  page.source = source;
  $("use-recording").disabled = !recorded;
  $("use-file").disabled = !file;
  $("use-recording").checked = source === "recording";
  $("use-file").checked = source === "file";
  $("recording-label").textContent = recorded
    ? `the recording (${recordedSeconds.toFixed(0)} s, ${kb(recorded)})`
    : "the recording (none yet)";
  $("file-label").textContent = file
    ? `the file ${file.name} (${kb(file)})`
    : "a chosen file (none yet)";
  $("source").dataset.source = source || "";
}

function chosenClip() {
  if (page.source === "file") return $("clip").files[0] || null;
  return page.source === "recording" ? recorded : null;
}

async function postVoice(clip, name, replace) {
  const form = new FormData();
  form.append("file", clip, clip.name || "recording.webm");
  form.append("name", name);
  form.append("consent", "true");
  if (replace) form.append("replace", "true");
  const response = await fetch("/v1/audio/voices", {
    method: "POST",
    headers: authHeaders(),
    body: form,
  });
  const body = await response.json().catch(() => ({}));
  return response.ok ? { ok: true, body } : { ok: false, error: httpError(response, body) };
}

const askReplace = (key) =>
  confirm(`You already have a voice named "${key}". Replace it with this clip?`);

async function enrol() {
  const clip = chosenClip();
  if (!clip) return showEnrolResult("Record a clip or choose a file first.");
  if (!$("consent").checked) {
    return showEnrolResult("Tick the consent box: enrol only the voice of someone who agreed.");
  }
  const name = $("voice-name").value.trim();
  const key = name.toLowerCase();
  // Re-enrolling one of one's own names replaces that voice: only when the user says so.
  let replace = false;
  if (key && ownedVoices().includes(key)) {
    if (!askReplace(key)) return showEnrolResult(`Kept your voice "${key}".`, "info");
    replace = true;
  }
  $("enrol-button").disabled = true;
  showEnrolResult("Enrolling the voice…", "info");
  try {
    let result = await postVoice(clip, name, replace);
    if (!result.ok && result.error.code === "voice_name_taken" && !replace) {
      await loadVoices(); // (enrolled from another tab meanwhile?)
      if (ownedVoices().includes(key)) {
        if (!askReplace(key)) return showEnrolResult(`Kept your voice "${key}".`, "info");
        replace = true;
        result = await postVoice(clip, name, true);
      }
    }
    if (!result.ok) {
      if (result.error.code === "unauthorized") await loadVoices();
      return showEnrolResult(`Not enrolled: ${describe(result.error)} (${result.error.code})`);
    }
    const id = result.body.id;
    await loadVoices();
    $("voice").value = id;
    page.enrolled = id;
    const done = replace ? "replaced" : "enrolled";
    showEnrolResult(`Voice "${id}" ${done}: it is selected in Voice.`, "success");
  } catch {
    showEnrolResult("The upload did not reach the server: check the connection and try again.");
  } finally {
    $("enrol-button").disabled = false;
  }
}

async function deleteVoice(name) {
  if (!confirm(`Delete your voice "${name}"? Speak cannot use it afterwards.`)) return;
  let response;
  try {
    response = await fetch(`/v1/audio/voices/${encodeURIComponent(name)}`, {
      method: "DELETE",
      headers: authHeaders(),
    });
  } catch {
    return showEnrolResult("The server did not answer: check the connection and try again.");
  }
  const body = await response.json().catch(() => ({}));
  await loadVoices(); // whatever the answer: the list shows what the server has now
  if (!response.ok) {
    const error = httpError(response, body);
    return showEnrolResult(`Not deleted: ${describe(error)} (${error.code})`);
  }
  if (page.enrolled === name) page.enrolled = null;
  showEnrolResult(`Voice "${name}" deleted.`, "success");
}

// -- start -------------------------------------------------------------------------------
async function refresh() {
  if (page.connection !== "unreachable") setConnection("connecting");
  if (!(await loadVoices())) return;
  showMessage("");
  try {
    await connect();
  } catch (e) {
    showMessage(e.message);
  }
}

function init() {
  const examples = $("examples");
  examples.replaceChildren(...EXAMPLES.map(([label], i) => new Option(label, String(i))));
  examples.onchange = () => ($("text").value = EXAMPLES[Number(examples.value)][1]);
  $("text").value = EXAMPLES[0][1];
  $("key").value = apiKey();
  $("key").onchange = () => {
    const key = $("key").value.trim();
    if (key) localStorage.setItem(KEY_STORAGE, key);
    else localStorage.removeItem(KEY_STORAGE);
    disconnect();
    page.ready = null;
    refresh();
  };
  $("speak").onclick = speak;
  $("speed").oninput = showSpeed;
  $("stop").onclick = stop;
  $("record").onclick = toggleRecording;
  $("enrol-button").onclick = enrol;
  $("clip").onchange = () => chooseSource("file");
  $("use-recording").onchange = () => chooseSource("recording");
  $("use-file").onchange = () => chooseSource("file");
  chooseSource(null);
  showVoices(null);
  setInterval(watchHealth, HEALTH_EVERY_S * 1000);
  requestAnimationFrame(drawWave);
  refresh().then(() => window.isSecureContext || showMessage(INSECURE));
}

init();
