# The device machine's environment, sourced by bench/gpu_run.sh and the other device scripts (one device call
# each): $OUT for logs, the carried wheels in .whl installed to /tmp/site, NVLink multicast off everywhere, the
# `step` banner and the Triton cache carry.
# The wheels (the device machine has torch and Triton, not these), fetched once from the repo root:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     fla-core==0.6.0 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 \
#     pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
#     opentelemetry-api==1.45.2
# (.whl is ignored by git: `echo /.whl/ >> .git/info/exclude`; each device call carries it.)
# Transformers goes in stripped (a device call carries at most 64 MiB with the tree): only the configs and
# tokenizers serving needs, the models `auto`, `glm5_next` and `encoder_decoder`, xz-compressed (1.5 MB):
#   unzip the transformers-5.23.0 wheel into D; in D/transformers/models delete every folder but those three;
#   tar -C D -cf - transformers transformers-5.23.0.dist-info | xz -9 > .whl/transformers-5.23.0.tar.xz
# For `serve -dp N` add the router: its wheel (31 MB) does not fit the carry beside the rest, so its package goes
# in stripped and xz-compressed (16 MB), unpacked here, with its dependencies' wheels (aiohttp, aiohappyeyeballs,
# aiosignal, attrs, frozenlist, multidict, propcache, yarl, orjson, setproctitle: the same download line):
#   unzip the sglang_router-0.3.2 wheel into D; strip D/sglang_router/sglang_router_rs.abi3.so;
#   tar -C D -cf - sglang_router sglang_router-0.3.2.dist-info | xz -9 > .whl/sglang_router-0.3.2.tar.xz
OUT=${OUT:-/tmp/tpserve-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
for packed in .whl/*.tar.xz; do [ -f "$packed" ] && tar -xJf "$packed" -C /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TPSERVE_CACHE_DIR=/tmp/tpserve-cache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 TRITON_CACHE_AUTOTUNING=1
step() { echo; echo "=== $1 ($(date +%T))"; }
# Triton's compile cache (a fresh machine spends ~3 min compiling fla's and our kernels): restored
# from .carry_triton/triton_cache.tar.gz when an earlier call brought one back. `save_triton_cache` at
# the end of a script writes the compiled binaries and metadata (no IR text), gzipped, to
# $OUT/triton_cache.tar.gz when it fits what a call returns (16 MiB a file). To use it next time:
# mkdir -p .carry_triton && cp FILES_AT/triton_cache.tar.gz .carry_triton/, and carry ".carry_triton"
# with ".whl". Fixed path: Triton's cache groups name their files by absolute path.
export TRITON_CACHE_DIR=/tmp/triton-cache; mkdir -p "$TRITON_CACHE_DIR"
if [ -f .carry_triton/triton_cache.tar.gz ]; then
  tar -xzf .carry_triton/triton_cache.tar.gz -C "$TRITON_CACHE_DIR" && echo "triton cache: restored $(du -sm "$TRITON_CACHE_DIR" | cut -f1) MB"
fi
save_triton_cache() {
  local tarball="$OUT/triton_cache.tar.gz" mb
  (cd "$TRITON_CACHE_DIR" && find . -type f \( -name '*.cubin' -o -name '*.json' \) -print0 | tar --null -T - -czf "$tarball")
  mb=$(( $(stat -c %s "$tarball") / 1048576 ))
  if [ "$mb" -lt "${TRITON_CACHE_MAX_MB:-15}" ]; then echo "triton cache: saved $mb MB (gzipped)"
  else rm -f "$tarball"; echo "triton cache: $mb MB gzipped, not under ${TRITON_CACHE_MAX_MB:-15} MB: not saved"; fi
}
