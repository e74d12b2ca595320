# Convenience targets; README.md gives the same commands.
PY ?= python3

.PHONY: deps install dev test demo
deps:
	bash scripts/install_deps.sh
install: deps
	$(PY) -m pip install --no-build-isolation .
# Editable install; the lock keeps concurrent rebuilds from sharing one build folder.
dev:
	flock /tmp/hetu-build.lock $(PY) -m pip install -q --no-build-isolation -e .
test:
	bash scripts/test.sh
demo:
	bash scripts/demo.sh
