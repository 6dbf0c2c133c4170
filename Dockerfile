# The jetorder sidecar: a static binary on an empty base image, run as a
# non-root user, its embedded nats-server's JetStream store in the volume
# /data.
#
#   docker build -t jetorder-sidecar --build-arg COMMIT=$(git rev-parse HEAD) .
#   docker run -p 8085:8085 -p 8080:8080 -v jetorder-data:/data -v $PWD/auth:/auth:ro \
#     jetorder-sidecar --tls-cert /auth/server.pem --tls-key /auth/server-key.pem \
#     --auth-tokens /auth/tokens --iam-policy /auth/policy.json
#
# Both APIs listen on every interface of the container, so the sidecar
# needs access control to start (docs/OPERATING.md, "Access control"): tokens,
# client certificates or JWTs, best over TLS. For a local trial without it,
# pass --allow-unauthenticated (JETORDER_ALLOW_UNAUTHENTICATED=true) and
# publish the ports to loopback only (-p 127.0.0.1:8085:8085). Flags go
# after the image name, or as JETORDER_* variables.

# GO_IMAGE: a Debian-based Go toolchain image (a shell, ca-certificates).
ARG GO_IMAGE=golang:1.26-bookworm

FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The commit --version shows: the build context has no .git (.dockerignore).
ARG COMMIT=
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-X main.commit=${COMMIT}" -o /out/sidecar ./cmd/sidecar
# What the empty base image lacks: a user, a store directory it owns, /tmp
# and CA certificates (for --nats-url over TLS and push to https endpoints).
RUN mkdir -p /out/etc/ssl/certs /out/data /out/tmp && chmod 1777 /out/tmp && \
    echo 'jetorder:x:65532:65532:jetorder:/data:/sbin/nologin' > /out/etc/passwd && \
    echo 'jetorder:x:65532:' > /out/etc/group && \
    cp /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/

FROM scratch
COPY --from=build /out/etc /etc
COPY --from=build /out/tmp /tmp
COPY --from=build --chown=65532:65532 /out/data /data
COPY --from=build /out/sidecar /usr/local/bin/sidecar
USER 65532:65532
ENV JETORDER_DATA_DIR=/data \
    JETORDER_GRPC_ADDR=:8085 \
    JETORDER_HTTP_ADDR=:8080
VOLUME /data
# 8085: the Pub/Sub gRPC API (PUBSUB_EMULATOR_HOST), 8080: the HTTP API.
# With --nats-listen :4222 the embedded nats-server too, which beyond
# loopback needs --nats-listen-user and --nats-listen-password, or client
# certificates (docs/OPERATING.md).
EXPOSE 8085 8080
ENTRYPOINT ["/usr/local/bin/sidecar"]
