# Two set-up commands for a fresh machine: `make demo` and `make test`.
# Everything is installed by these targets: the venv (pip, pinned), the JVM jars
# (Maven, pinned in jvm/pom.xml), and Postgres (apt-get, by `lakesync up` when absent).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
JARS   := build/jvm/.resolved
# Every class a Spark session loads, and a Kafka broker and a Connect worker as they start,
# recorded once for the JVM's class-data sharing (`archive_classes` in
# sync/streaming/spark.py and sync/stack): each later Spark process, broker and worker starts sooner.
CLASSES := build/jvm/spark-classes.jsa
STACK_CLASSES := build/jvm/kafka-classes.jsa

# docker-compose.yml's loader (compose-go, as Docker Compose v2 loads it), for tests/unit/test_compose.py.
COMPOSECHECK := build/composecheck

.PHONY: demo test chaos bench bench-down unit e2e venv jars up down clean

demo: venv jars
	$(BIN)/lakesync demo

# Two workers (pytest-xdist): the end-to-end tests in one, everything needing no stack in the
# other (the groups: tests/conftest.py).
test: venv jars $(COMPOSECHECK)
	$(BIN)/python -m pytest tests --ignore=tests/chaos -n 2 --dist loadgroup

# Kills and restarts under a workload; its own stack session (.ci/run runs it after test).
chaos: venv jars
	$(BIN)/python -m pytest -s tests/chaos

# Its own stack (home and ports apart from the demo's, the tests' and the chaos run's, all below
# the ephemeral range 32768-60999), no search index.
BENCH_ENV := LAKESYNC_HOME=$(CURDIR)/.stack-bench LAKESYNC_PG_DSN=postgresql://lakesync_admin@127.0.0.1:22432/lakesync \
	LAKESYNC_KAFKA_BOOTSTRAP=127.0.0.1:22092 LAKESYNC_CONNECT_URL=http://127.0.0.1:22083 \
	LAKESYNC_SEARCH_URL=off LAKESYNC_METRICS_PORT=22400 LAKESYNC_SPARK_MASTER_PORT=22077 TZ=UTC

# On a new stack each time: a stack kept from a run before holds its records too, which the
# read ceiling and the rebuild would read again (twice the topics).
bench: venv jars
	$(BENCH_ENV) $(BIN)/lakesync down > /dev/null
	rm -rf .stack-bench
	$(BENCH_ENV) $(BIN)/lakesync bench $(BENCH_ARGS)

bench-down:
	$(BENCH_ENV) $(BIN)/lakesync down

unit: venv $(COMPOSECHECK)
	$(BIN)/python -m pytest tests/unit

e2e: venv jars
	$(BIN)/python -m pytest tests/e2e

venv: $(BIN)/lakesync

# setuptools: the build backend pyproject.toml names (>=68; bdist_wheel built in since 70.1),
# so tests/unit/test_packaging.py builds the wheel offline (--no-build-isolation).
$(BIN)/lakesync: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip==25.3
	$(BIN)/pip install --quiet setuptools==84.2.1
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

jars: $(JARS) $(CLASSES) $(STACK_CLASSES)

# Go from the machine, compose-go and its dependencies from the Go module proxy (pinned by go.sum).
$(COMPOSECHECK): tests/compose/main.go tests/compose/go.mod tests/compose/go.sum
	@command -v go >/dev/null || { echo "Go is required to build the Compose file's checker" >&2; exit 2; }
	cd tests/compose && GOFLAGS=-mod=readonly go build -o $(CURDIR)/$@ .

$(JARS): jvm/pom.xml jvm/kafka/pom.xml jvm/spark/pom.xml jvm/smt/pom.xml jvm/hadoop/pom.xml jvm/opensearch/pom.xml \
		$(shell find jvm/smt/src jvm/hadoop/src -type f)
	@command -v mvn >/dev/null || { echo "Maven (mvn) is required to resolve the JVM jars: apt-get install maven" >&2; exit 2; }
	@command -v java >/dev/null || { echo "Java 17+ is required: apt-get install openjdk-17-jre-headless" >&2; exit 2; }
	rm -rf build/jvm
	mvn --batch-mode --quiet -f jvm/pom.xml package
	touch $@

$(CLASSES): $(JARS) $(BIN)/lakesync
	$(BIN)/python -m sync.streaming.spark

$(STACK_CLASSES): $(JARS) $(BIN)/lakesync
	$(BIN)/python -c 'from sync.config import load; from sync.stack import archive_classes; print(*archive_classes(load()), sep="\n")'

up: venv jars
	$(BIN)/lakesync up

down:
	$(BIN)/lakesync down

clean: down bench-down
	rm -rf .stack .stack-bench build
