// The playground: voices from GET /v1/audio/voices, speech over the server's streaming
// WebSocket (docs/protocol.md), played as it arrives by player-worklet.js in an AudioContext
// that runs at the stream's sample rate (the browser resamples to the device), with a live
// waveform and the figures of the utterance in flight: time to first audio, real-time factor,
// underruns. Everything is fetched from the server that served this page.

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = "pipecat-veena.api_key";
const STREAM_PATH = "/v1/audio/stream";
const WORKLET = "/playground/player-worklet.js";
const PREBUFFER_S = 0.1; // audio held before playback starts (doubled after each underrun)
const AUDIO_FRAME = 0x01;
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
};
window.playground = page;

let socket = null; // {ws, ready: Promise of the ready message, failure: the error before close}
let audio = null; // {rate, ctx, analyser, node, loaded: Promise}
let sequence = 0;

// -- messages and the API key -------------------------------------------------------------
function showMessage(text) {
  page.message = text;
  $("message").textContent = text;
  $("message").hidden = !text;
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
  return apiKey()
    ? `The server did not accept this API key: check it in the API key field. (${error.message})`
    : "This server needs an API key: enter it in the API key field above. " +
        `(${error.message})`;
}

// -- voices ------------------------------------------------------------------------------
async function loadVoices() {
  let response;
  try {
    response = await fetch("/v1/audio/voices", { headers: authHeaders() });
  } catch (e) {
    showMessage(`The speech server does not answer (${e.message}); is it still running?`);
    return false;
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = body.error || { code: "http_" + response.status, message: response.statusText };
    if (response.status === 503 && error.code === "server_starting") {
      showMessage("The engine is still loading; this page retries every 2 s.");
      setTimeout(refresh, 2000);
    } else {
      showMessage(describe(error));
    }
    return false;
  }
  page.voices = body;
  const select = $("voice");
  select.replaceChildren(...body.voices.map((name) => new Option(name, name)));
  select.value = body.default;
  $("demo").hidden = !body.demo;
  $("model").textContent = `${body.model} · ${body.voices.length} voices`;
  return true;
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
  if (socket) socket.ws.close();
  socket = null;
}

function onMessage(s, msg) {
  const u = page.utterance;
  if (msg.type === "ready") {
    page.ready = msg;
    $("model").textContent =
      `${msg.model} · ${msg.sample_rate} Hz · voices: ${msg.voices.join(", ")}`;
    s.resolve(msg);
  } else if (msg.type === "done" && u && msg.id === u.id) {
    u.done = msg;
    u.state = msg.reason === "cancelled" ? "cancelled" : "completed";
    post({ type: "end" });
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
  const why = failure
    ? describe(failure)
    : `The connection to the speech server closed (code ${event.code}).`;
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

function onPlayer(stats) {
  const u = page.utterance;
  if (!u || stats.stream !== u.id) return; // a report about an earlier utterance
  u.played = stats.played;
  u.buffered = stats.buffered;
  u.underruns = stats.underruns;
  if (stats.event === "drained" || stats.event === "stopped") u.playback = stats.event;
  else u.playback = stats.playing ? "playing" : "waiting";
  render();
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
  return options;
}

function newUtterance(id, rate) {
  return {
    id,
    sampleRate: rate,
    state: "speaking", // speaking, stopping, completed, cancelled, failed
    playback: "waiting", // waiting, playing, drained, stopped
    sentAt: performance.now(),
    firstAudioMs: null,
    lastAudioMs: null,
    rtf: null,
    frames: 0,
    samples: 0,
    tokens: 0,
    peak: 0,
    played: 0,
    buffered: 0,
    underruns: 0,
    done: null,
    error: null,
  };
}

async function speak() {
  const text = $("text").value.trim();
  if (!text) return showMessage("Type some text to speak first.");
  const options = readOptions();
  if (options === null) return;
  showMessage("");
  stop();
  // Create the AudioContext in the click itself when the stream's rate is already known.
  if (page.ready) ensureAudio(page.ready.sample_rate).catch(() => {});
  $("speak").disabled = true;
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
    page.utterance = newUtterance(id, rate);
    post({ type: "start", prebufferSeconds: PREBUFFER_S });
    socket.ws.send(JSON.stringify(message));
  } catch (e) {
    showMessage(e.message);
  } finally {
    $("speak").disabled = false;
    render();
  }
}

function stop() {
  const u = page.utterance;
  if (!u) return;
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
  if (u.state === "completed" && u.playback !== "drained") return "received, playing";
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
  $("ttfa").textContent =
    u.firstAudioMs !== null ? `${Math.round(u.firstAudioMs)} ms` : busy ? "waiting…" : "–";
  $("rtf").textContent = u.rtf !== null ? u.rtf.toFixed(2) : "–";
  $("underruns").textContent = String(u.underruns);
  $("received").textContent = `${seconds(u.samples, u)} (${u.samples} samples)`;
  $("played").textContent = seconds(u.played, u);
  $("buffered").textContent = `${Math.round((1000 * u.buffered) / u.sampleRate)} ms`;
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
  requestAnimationFrame(drawWave);
}

// -- start -------------------------------------------------------------------------------
async function refresh() {
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
  $("stop").onclick = stop;
  requestAnimationFrame(drawWave);
  refresh().then(() => window.isSecureContext || showMessage(INSECURE));
}

init();
