# Local stand-in for python:3.11-slim-bookworm (testbed/images/build-base.sh):
# Debian bookworm's CPython 3.11 on the debootstrap base. The service
# Dockerfiles only need `python3` on PATH, venv support and CA certificates.
ARG BASE_IMAGE=localhost/polycorn-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -q \
 && apt-get install -y -q python3 python3-venv ca-certificates \
 && ln -s /usr/bin/python3 /usr/local/bin/python \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
# uv (webpki roots) and pip (certifi) carry their own CA lists: point them at
# the system bundle, which build-base.sh gave the machine's trust anchors.
ENV LANG=C.UTF-8 \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
LABEL org.opencontainers.image.description="Debian bookworm python3.11 (apt), local stand-in for python:3.11-slim-bookworm"
CMD ["python3"]
