# Redis for deploy/compose.yaml, from Debian 12's redis-server package, so the
# compose file needs no image registry (the official redis image works as
# well: set XFER_REDIS_IMAGE=docker.io/library/redis:7 and drop `build:`).
ARG BASE=debian:bookworm
FROM ${BASE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        redis-server redis-tools >/dev/null \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
 && install -d -o redis -g redis -m 0750 /data
USER redis
WORKDIR /data
EXPOSE 6379
CMD ["redis-server", "--dir", "/data", "--appendonly", "yes", "--protected-mode", "no"]
