# redlockd: build with the pinned Rust toolchain, run on a minimal non-root image.
#   docker build -t redlockd .
#   docker run -p 8080:8080 -e REDLOCKD_REDIS_URLS=redis://a:6379,redis://b:6379,redis://c:6379 redlockd

FROM rust:1.95.0-slim-bookworm AS build
WORKDIR /src

# Dependencies first, against stub sources: this layer is rebuilt only when Cargo.toml or
# Cargo.lock change, not on every source edit.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && echo 'fn main() {}' > benches/grant.rs \
    && cargo build --release --locked --bin redlockd \
    && rm -rf src benches

COPY src ./src
COPY benches ./benches
# Newer mtimes than the stubs', so cargo rebuilds the crate itself.
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin redlockd \
    && cp target/release/redlockd /redlockd

# The docs site (docs/, with a runbook page per alert), served by the image at /book/.
FROM rust:1.95.0-slim-bookworm AS book
RUN cargo install --locked --no-default-features --version 0.5.4 mdbook
WORKDIR /src
COPY book.toml CHANGELOG.md ./
COPY docs ./docs
RUN mdbook build --dest-dir /book

# glibc, CA certificates (for rediss:// masters and https:// servers), and a non-root
# user; no shell.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /redlockd /usr/local/bin/redlockd
COPY --from=book /book /usr/share/redlockd/book
ENV REDLOCKD_LISTEN=0.0.0.0:8080 \
    REDLOCKD_LOG_FORMAT=json \
    REDLOCKD_BOOK_DIR=/usr/share/redlockd/book
EXPOSE 8080
USER 65532:65532
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/redlockd", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/redlockd"]
CMD ["serve"]
