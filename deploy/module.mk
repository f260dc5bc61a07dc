# Deployment targets (deploy/, mk/bundle.sh, docs/deploy.md).
#   make bundle        dist/xfer-bundle-<ver>.tar.gz, relocatable ($ORIGIN rpaths)
#   make deps-deploy   podman, podman-compose, runc, debootstrap, patchelf (root)
#   make test-deploy   container image + compose brought up for real, and the
#                      bundle run in a chroot without -dev packages

bundle:
	@$(MAKE) --no-print-directory $(LIBXFER)
	@$(MAKE) --no-print-directory $(B)/bin/xferd $(B)/bin/xferctl
	@B=$(B) bash mk/bundle.sh dist

deps-deploy:
	@bash mk/deps.sh deploy

test-deploy: deps deps-deploy
	@$(MAKE) --no-print-directory all
	@B=$(B) XFER_TESTS='deploy_bundle|metrics' bash tests/run.sh integration
	@B=$(B) bash tests/integration/deploy_compose.sh; rc=$$?; \
	    if [ $$rc -eq 77 ]; then echo "compose test skipped (no container engine can run here)"; \
	    elif [ $$rc -ne 0 ]; then exit $$rc; fi

.PHONY: bundle deps-deploy test-deploy

