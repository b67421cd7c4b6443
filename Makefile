# Partially Trainable: the book, its notebooks and the refimpl package.
#   make book     build the HTML book into _build/html (from stored outputs)
#   make check    lint and the fast tests (no `slow` marker), in about a minute
#   make test     everything CI runs: lint, every test, the Keras-level tests
#                 again under JAX and PyTorch, notebooks, strict build, the book
#                 in a browser
#   make backends the Keras-level tests under JAX and under PyTorch (which it
#                 installs), and the book's PyTorch recipes
#   make torch    that PyTorch stage alone
#   make distribution  keras.distribution tests on 8 simulated JAX devices
#   make browser  build the book and check it in headless Chromium, offline
#   make execute  re-run every notebook in place after editing it
#   make bench    run the benchmarks and rewrite evidence/benchmarks/results/
#                 (one layer; a transformer and a CNN in results/real/, the
#                 transformer on an int8 base, and eight
#                 sparse adapters served in one mixed batch)
#   make nightly  the fast tests and the README's examples on Keras' nightly
#                 build (keras-nightly and keras-hub-nightly, pinned in
#                 requirements-nightly.txt) in .venv-nightly; not part of
#                 `make test`, and failures listed in CHANGELOG.md are expected
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NOTEBOOKS ?= $(wildcard intro.ipynb) $(sort $(wildcard chapters/*.ipynb)) \
  $(sort $(wildcard appendices/*.ipynb))
LINT_PATHS := $(wildcard refimpl evidence tests tools chapters appendices intro.ipynb)

export IPYTHONDIR := $(CURDIR)/tools/ipython
export TF_CPP_MIN_LOG_LEVEL := 3
export PYTHONHASHSEED := 0

.PHONY: book check test lint unit fast notebooks check-book build-book execute bench clean
.PHONY: browser backends distribution nightly torch

# PyTorch for the torch stage of `make backends`, kept out of requirements.txt so
# that `make book` stays light. pip takes the CPU wheel from TORCH_FIND_LINKS
# where that folder exists (it installs offline then), and PyPI's build
# otherwise; TORCH_PIP_ARGS passes pip more (another index, say).
TORCH            ?= torch==2.13.0
TORCH_FIND_LINKS ?= /opt/wheels
TORCH_PIP_ARGS   ?=

# MathJax for the book, served from the build (no CDN): tools/install_mathjax.py
# fetches the pinned npm package into the git-ignored _mathjax/.
MATHJAX  := _mathjax/_static/mathjax/es5/tex-mml-chtml.js
# Debian's Chromium, for `make browser`.
CHROMIUM ?= /usr/bin/chromium

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -c 'import sys; assert (3, 11) <= sys.version_info[:2] <= (3, 12), "Python 3.11-3.12 is required, found " + sys.version.split()[0]'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	@# The wheel holds refimpl alone; the book and the tests also import the
	@# repository's evidence package, from the checkout.
	$(BIN)/python -c "import pathlib, site; pathlib.Path(site.getsitepackages()[0], 'partially_trainable_checkout.pth').write_text('$(CURDIR)\n')"
	touch $(STAMP)

$(STAMP): $(MATHJAX)

$(MATHJAX): tools/install_mathjax.py
	@command -v npm >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q npm; \
	  else echo "npm is needed to install MathJax: install Debian's npm package (apt-get install npm)"; exit 1; fi; }
	$(PYTHON) tools/install_mathjax.py

book: $(STAMP)
	rm -rf _build
	$(BIN)/jupyter-book build . --all -W --keep-going
	@echo "Open the book: file://$(CURDIR)/_build/html/index.html"

check: lint fast

test: lint unit backends check-book notebooks build-book browser

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

unit: $(STAMP)
	$(BIN)/python -m pytest -q --durations=10 tests --doctest-modules refimpl evidence

# The Keras-level tests (marked every_backend) and refimpl's doctests on the
# other backends; TensorFlow runs them in `unit`. The torch stage always runs:
# it installs PyTorch, and REFIMPL_TORCH_TESTS=required fails a test that
# would skip for want of it (the book's PyTorch recipes and its sentence on
# the torch backend).
backends: $(STAMP)
	KERAS_BACKEND=jax $(BIN)/python -m pytest -q --durations=10 -m every_backend tests --doctest-modules refimpl
	$(MAKE) distribution
	$(MAKE) torch

torch: $(STAMP)
	$(BIN)/python -m pip install --quiet \
	  $(if $(wildcard $(TORCH_FIND_LINKS)),--find-links $(TORCH_FIND_LINKS)) \
	  $(TORCH_PIP_ARGS) "$(TORCH)"
	KERAS_BACKEND=torch REFIMPL_TORCH_TESTS=required \
	  $(BIN)/python -m pytest -q --durations=10 -m every_backend tests --doctest-modules refimpl
	REFIMPL_TORCH_TESTS=required $(BIN)/python -m pytest -q \
	  tests/test_torch_recipes.py tests/test_book_backends.py

# keras.distribution on 8 simulated JAX devices: a mesh fixes its devices when
# JAX starts, so these tests run in a process of their own.
distribution: $(STAMP)
	KERAS_BACKEND=jax XLA_FLAGS=--xla_force_host_platform_device_count=8 \
	  REFIMPL_DISTRIBUTION_TESTS=required \
	  $(BIN)/python -m pytest -q tests/test_keras_distribution.py

fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests --doctest-modules refimpl evidence

check-book: $(STAMP)
	$(BIN)/python tools/check_book.py
	$(BIN)/python tools/check_numbers.py

notebooks: $(STAMP)
	$(BIN)/python -m pytest -q --durations=16 --nbval --nbval-current-env \
	  --nbval-sanitize-with tools/nbval_sanitize.cfg $(NOTEBOOKS)

build-book: book

# The built book in headless Chromium, offline (tests/browser): every page loads
# without console errors or outside requests, math typeset, images loaded with
# alt text, no sideways scroll at 400 px, navigation opens on a phone, search
# works.
browser: $(STAMP) book
	@test -x $(CHROMIUM) || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	  else echo "$(CHROMIUM) is missing: install Debian's chromium package (apt-get install chromium)"; exit 1; fi; }
	BOOK_HTML=$(CURDIR)/_build/html CHROMIUM=$(CHROMIUM) \
	  $(BIN)/python -m pytest -q tests/browser --confcutdir=tests/browser

execute: $(STAMP)
	for nb in $(NOTEBOOKS); do \
	  $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=600 --ExecutePreprocessor.record_timing=False \
	    $$nb || exit 1; \
	done

bench: $(STAMP)
	$(BIN)/python -m evidence.benchmarks.run
	$(BIN)/python -m evidence.benchmarks.real_models
	$(BIN)/python -m evidence.benchmarks.real_models --components
	$(BIN)/python -m evidence.benchmarks.real_models --quantized
	$(BIN)/python -m evidence.benchmarks.real_models --quantized --components
	$(BIN)/python -m evidence.benchmarks.adapters

# Keras' nightly build in a venv of its own: requirements.txt (refimpl from the
# checkout) with keras and keras-hub swapped for the pins in
# requirements-nightly.txt, which says why they install with --no-deps and how
# to bump them. Both pytest runs go to the end; the target fails if either did.
NIGHTLY       := .venv-nightly
NIGHTLY_STAMP := $(NIGHTLY)/.installed

$(NIGHTLY_STAMP): requirements.txt requirements-nightly.txt pyproject.toml
	$(PYTHON) -c 'import sys; assert (3, 11) <= sys.version_info[:2] <= (3, 12), "Python 3.11-3.12 is required, found " + sys.version.split()[0]'
	test -x $(NIGHTLY)/bin/python || $(PYTHON) -m venv $(NIGHTLY)
	$(NIGHTLY)/bin/python -m pip install --quiet --upgrade pip
	$(NIGHTLY)/bin/python -m pip install --quiet -r requirements.txt
	$(NIGHTLY)/bin/python -m pip uninstall --quiet -y keras-nightly keras-hub-nightly keras keras-hub
	$(NIGHTLY)/bin/python -m pip install --quiet --no-deps -r requirements-nightly.txt
	$(NIGHTLY)/bin/python -c "import pathlib, site; pathlib.Path(site.getsitepackages()[0], 'partially_trainable_checkout.pth').write_text('$(CURDIR)\n')"
	touch $(NIGHTLY_STAMP)

nightly: $(NIGHTLY_STAMP)
	@$(NIGHTLY)/bin/python -c "import keras, keras_hub, refimpl; print('keras', keras.__version__, '- keras-hub', keras_hub.__version__, '- refimpl from', refimpl.__path__[0])"
	@status=0; \
	$(NIGHTLY)/bin/python -m pytest -q -m "not slow" tests --doctest-modules refimpl || status=1; \
	$(NIGHTLY)/bin/python -m pytest -q tests/test_readme.py || status=1; \
	exit $$status

clean:
	rm -rf _build
