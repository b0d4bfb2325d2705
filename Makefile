# One entry point for everything. Every target sets itself up: `make test` or `make sim` on a fresh
# clone creates .venv from the pins in pyproject.toml first (and only when that file changed).
#
#   make sim        the main job: a Verilator simulation with a report, a pcap and a waveform
#   make test       the whole regression: model, Amaranth-simulator and cocotb/Verilator tiers
#   make test-fast  the model and Amaranth-simulator tiers only (seconds)
#   make bench      benchmarks -> build/bench/results.json and a table (BENCH="rdma_goodput ..."
#                   runs those only)
#   make verilog    every top-level module -> build/verilog/*.v, and build/include/iwarp_nic.h
#   make lint       ruff, and verilator --lint-only -Wall on every top not part of another
#   make bitstream BOARD=ecpix5   a board bitstream with utilisation and timing report
#                                 (ecpix5, butterstick, colorlight_5a75b, ecpix5_echo)
#   make siw-guest  the QEMU guest running Linux siw -> build/siw/<variant>/ (VARIANT=stock|crc|rev1|all)
#   make interop    the simulated NIC against every siw build -> the README's interop matrix
#   make fuzz       the full fuzz campaigns: 10^6 mutated frames into a NIC carrying traffic
#                   (FUZZ_FRAMES=n for another size; make test runs 8,000), and 7,000
#                   attackers' FPDU streams, one FPDU mutated each (FUZZ_FPDU_CASES=n; make
#                   test runs 280)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
BOARD  ?= ecpix5
JOBS   ?= $(shell nproc 2>/dev/null || echo 2)
SIM_ARGS ?=
BENCH  ?=
VARIANT ?= stock
FUZZ_FRAMES ?= 1000000
FUZZ_FPDU_CASES ?= 7000

# cocotb, Verilator and the yowasp tools find themselves through these (see iwarp_tb.toolchain).
RUN := $(PY) -m iwarp_tb.toolchain --

.PHONY: venv test test-fast sim bench verilog lint bitstream siw-guest interop fuzz clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --editable .
	@touch $@

# QEMU guests run under TCG emulation and time out when they share the cores with Verilator
# builds: the siw tests run after the rest, on their own.
test: $(STAMP)
	$(RUN) $(PY) -m pytest -n $(JOBS) -m "not siw" --durations=40
	$(RUN) $(PY) -m pytest -m siw --durations=20

test-fast: $(STAMP)
	$(RUN) $(PY) -m pytest -n $(JOBS) sim/tests hdl/tests

sim: $(STAMP)
	$(RUN) $(PY) -m iwarp_tb.sim $(SIM_ARGS)

bench: $(STAMP)
	$(RUN) $(PY) -m iwarp_tb.bench $(BENCH)

verilog: $(STAMP)
	$(RUN) $(PY) -m iwarp_nic verilog --out build/verilog
	$(PY) -m iwarp_nic header --out build/include/iwarp_nic.h

lint: $(STAMP)
	$(PY) -m ruff check hdl sim tb boards
	$(RUN) $(PY) -m iwarp_nic verilog --outermost --out build/lint
	$(RUN) $(PY) -m iwarp_tb.lint build/lint

bitstream: $(STAMP)
	$(RUN) $(PY) -m boards.build $(BOARD)

siw-guest: $(STAMP)
	$(RUN) $(PY) -m iwarp_tb.siw.guest build --variant $(VARIANT)

# The table is written whatever the tests gave; the target fails if one failed.
interop: $(STAMP)
	mkdir -p build/interop
	-IWARP_INTEROP_ALL=1 $(RUN) $(PY) -m pytest tb/siw/test_nic_vs_siw.py -k "not impaired" --junitxml=build/interop/junit.xml
	$(PY) -m iwarp_tb.siw.matrix build/interop/junit.xml --readme README.md

fuzz: $(STAMP)
	IWARP_FUZZ_FRAMES=$(FUZZ_FRAMES) IWARP_FPDU_FUZZ_CASES=$(FUZZ_FPDU_CASES) $(RUN) \
		$(PY) -m pytest -n $(JOBS) -rA tb/nic/test_nic_fuzz.py tb/nic/test_nic_fpdu_fuzz.py

clean:
	rm -rf build
