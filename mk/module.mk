# make check-deps: fails on an include across the layers the design forbids
# (mk/check_deps.sh has the rules); make test runs it too
# (tests/integration/test_check_deps.sh).
check-deps:
	@bash mk/check_deps.sh

.PHONY: check-deps
