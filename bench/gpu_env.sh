# Sourced by the bench/gpu_run_*.sh scripts (one device call each): $OUT for logs, the carried
# wheels in .whl installed to /tmp/site, NVLink multicast off everywhere, and the `step` banner.
# The wheels (the device machine has torch and Triton, not these), fetched once from the repo root:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     fla-core==0.6.0 transformers==5.23.0 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 \
#     pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
#     opentelemetry-api==1.45.2
# (.whl is ignored by git: `echo /.whl/ >> .git/info/exclude`; each device call carries it.)
OUT=${OUT:-/tmp/tpserve-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TPSERVE_CACHE_DIR=/tmp/tpserve-cache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 TRITON_CACHE_AUTOTUNING=1
step() { echo; echo "=== $1 ($(date +%T))"; }
