// Plays PCM as it streams in. The main thread posts Float32 chunks; they wait in a ring buffer
// (grown when full) that the audio thread drains 128 samples at a time. Playback starts once a
// short prebuffer is there, and every start and stop is faded over a few milliseconds, so a
// stream that runs dry, resumes or is stopped never clicks. An underrun is the player running
// dry after it started, before the stream ended; each one doubles the prebuffer (up to 1 s).
// The page starts each stream with a prebuffer learned from the ones before (their deficit).
//
// Messages in:  {type: "start", prebufferSeconds}  a new stream (fades out what is left)
//               {type: "pcm", samples}             a Float32Array chunk, in order
//               {type: "end"}                      no more chunks: play the rest
//               {type: "stop"}                     fade out now and drop the rest
// Every message in carries the page's stream id; reports echo the id of the current stream.
// Messages out: {type: "stats", stream, played, buffered, underruns, playing, prebuffer,
//               deficit, event, soundAt, at}
//               prebuffer: the audio this stream waits for before it plays, in seconds (the
//               start's, doubled by each underrun). deficit: the longest the player has waited
//               dry for the next chunk, in seconds (0 without an underrun): a prebuffer that
//               much longer would have played through.
//               event: "underrun", "drained" (the stream played out), "stopped", "sound" (the
//               first sample that is not silence was just played: soundAt is its time on the
//               AudioContext's clock) or null. at: when sample number `played` of the stream
//               plays, on the AudioContext's clock, if playback goes on (the page follows the
//               words being played with it).

const QUANTUM = 128; // samples per process() call
const FADE = 64; // samples of every fade-in
const LOW = 2 * QUANTUM; // below this, before the end, the player fades out and waits
const MAX_PREBUFFER_S = 1.0;
const REPORT_EVERY = 4; // process() calls between stats messages
const SOUND = 1 / 1024; // a played sample at least this loud (-60 dBFS) is sound, not silence

class StreamPlayer extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ring = new Float32Array(1 << 15);
    this.release = null; // the faded-out end of a stream replaced while it played
    this.stream = null;
    this.reset(0);
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  reset(prebufferSeconds) {
    this.head = 0;
    this.count = 0;
    this.prebuffer = Math.max(LOW + QUANTUM, Math.round(prebufferSeconds * sampleRate));
    this.active = false;
    this.playing = false;
    this.ended = false;
    this.stopping = false;
    this.fadeIn = 0;
    this.played = 0;
    this.underruns = 0;
    this.dryAt = null; // when the last underrun began (context time), until the next chunk
    this.deficit = 0;
    this.calls = 0;
    this.soundAt = null; // when the first sample that is not silence played (context time)
  }

  onMessage(message) {
    if (message.type === "start") {
      if (this.playing) {
        const n = Math.min(this.count, QUANTUM);
        this.release = new Float32Array(n);
        this.copyOut(this.release, n);
        for (let i = 0; i < n; i++) this.release[i] *= (n - i) / n;
      }
      this.reset(message.prebufferSeconds);
      this.stream = message.stream;
      this.active = true;
    } else if (message.type === "pcm" && this.active && !this.stopping) {
      this.push(message.samples);
    } else if (message.type === "end") {
      this.ended = true;
    } else if (message.type === "stop") {
      this.stopping = this.active;
    }
  }

  push(samples) {
    if (this.dryAt !== null) {
      this.deficit = Math.max(this.deficit, currentTime - this.dryAt);
      this.dryAt = null;
    }
    if (this.count + samples.length > this.ring.length) {
      let size = this.ring.length * 2;
      while (size < this.count + samples.length) size *= 2;
      const grown = new Float32Array(size);
      this.copyOut(grown, this.count);
      this.ring = grown;
      this.head = 0;
    }
    const size = this.ring.length;
    const tail = (this.head + this.count) % size;
    const first = Math.min(samples.length, size - tail);
    this.ring.set(samples.subarray(0, first), tail);
    this.ring.set(samples.subarray(first), 0);
    this.count += samples.length;
  }

  // Copies the oldest n samples into out[0..n) and drops them from the ring.
  take(out, n) {
    this.copyOut(out, n);
    this.head = (this.head + n) % this.ring.length;
    this.count -= n;
    this.played += n;
  }

  copyOut(out, n) {
    const first = Math.min(n, this.ring.length - this.head);
    out.set(this.ring.subarray(this.head, this.head + first), 0);
    out.set(this.ring.subarray(0, n - first), first);
  }

  report(event = null) {
    this.port.postMessage({
      type: "stats",
      stream: this.stream,
      played: this.played,
      buffered: this.count,
      underruns: this.underruns,
      playing: this.playing,
      prebuffer: this.prebuffer / sampleRate,
      deficit: this.deficit,
      event,
      soundAt: this.soundAt,
      at: currentTime + QUANTUM / sampleRate, // (reports come from process(): its quantum's end)
    });
  }

  // The first sound of a stream: the time its first sample at least SOUND loud plays.
  findSound(out, n) {
    for (let i = 0; i < n; i++) {
      if (Math.abs(out[i]) >= SOUND) {
        this.soundAt = currentTime + i / sampleRate;
        return true;
      }
    }
    return false;
  }

  process(inputs, outputs) {
    const channels = outputs[0];
    const out = channels[0];
    out.fill(0);
    if (this.active) this.render(out);
    if (this.release) {
      for (let i = 0; i < this.release.length; i++) out[i] += this.release[i];
      this.release = null;
    }
    for (let c = 1; c < channels.length; c++) channels[c].set(out);
    return true;
  }

  render(out) {
    if (this.stopping) {
      const n = Math.min(this.count, QUANTUM);
      if (this.playing) {
        this.take(out, n);
        for (let i = 0; i < n; i++) out[i] *= (n - i) / n;
      }
      this.active = this.playing = false;
      this.count = 0;
      this.report("stopped");
      return;
    }
    if (!this.playing) {
      if (this.count >= this.prebuffer || (this.ended && this.count > 0)) {
        this.playing = true;
        this.fadeIn = FADE;
      } else if (this.ended) {
        this.active = false;
        this.report("drained");
        return;
      }
    }
    let event = null;
    if (this.playing) {
      const n = Math.min(this.count, QUANTUM);
      this.take(out, n);
      for (let i = 0; i < n && this.fadeIn > 0; i++, this.fadeIn--) {
        out[i] *= 1 - this.fadeIn / FADE;
      }
      if (this.soundAt === null && this.findSound(out, n)) event = "sound";
      if (!this.ended && this.count < LOW) {
        // Running dry: fade this block out and wait for a (longer) prebuffer again.
        for (let i = 0; i < n; i++) out[i] *= (n - i) / n;
        this.playing = false;
        this.underruns += 1;
        this.dryAt = currentTime;
        this.prebuffer = Math.min(2 * this.prebuffer, Math.round(MAX_PREBUFFER_S * sampleRate));
        event = "underrun";
      } else if (this.ended && this.count === 0) {
        this.playing = this.active = false;
        event = "drained";
      }
    }
    this.calls += 1;
    if (event !== null || this.calls % REPORT_EVERY === 0) this.report(event);
  }
}

registerProcessor("stream-player", StreamPlayer);
