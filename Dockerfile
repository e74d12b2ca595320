# hetu on Debian, built and installed exactly as scripts/install_deps.sh and README.md do it.
FROM python:3.11-slim-bookworm
WORKDIR /opt/hetu
COPY . .
RUN bash scripts/install_deps.sh && python3 -m pip install --no-build-isolation . && rm -rf build
CMD ["bash", "scripts/demo.sh"]
