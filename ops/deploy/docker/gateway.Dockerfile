# The gateway: Starlette + Redis client, no torch.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN useradd --create-home --uid 10001 arbor
WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY gateway ./gateway
COPY worker ./worker
COPY ops ./ops
RUN pip install '.[gateway]' && python -c "import gateway.app, sys; assert 'torch' not in sys.modules"
USER arbor
ENV ARBOR_HOST=0.0.0.0 ARBOR_PORT=8000
EXPOSE 8000
CMD ["arbor", "gateway"]
