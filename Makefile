# Shortcuts for the scripts in scripts/ (which need only bash).
.PHONY: build test demo bench clean
build:
	scripts/build.sh
test:
	scripts/test.sh
demo:
	scripts/demo.sh
bench: build
	bench/telemetry_overhead
clean:
	rm -rf build
