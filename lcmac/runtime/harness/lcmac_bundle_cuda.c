/*
 * lcmac_bundle_cuda.c — CUDA bundles from C (lcmac_open_cuda_bundle's workspace,
 * lcmac_bundle_cuda_matmul of lcmac.h): exact and rows rules on device memory.  #included by
 * lcmac_bundle.c after the CPU bundle code, whose index reader and rule cut it shares.
 */

/* ---- CUDA bundles: exact and rows rules on device memory ---- */

static int64_t round256(int64_t n) { return (n + 255) / 256 * 256; }

/* The bundle's workspace: the largest kernel workspace, then the padding of the rows rules
 * (P_min x K of A, P_min x N of C), allocated once at open so that calls allocate nothing. */
static int cuda_bundle_workspace(lcmac_bundle* b, char* err, size_t errlen, const char* who) {
  int64_t sz = (int64_t)dtype_bytes(b->dtype), kws = 0, pad = 0;
  for (int i = 0; i < b->nkernels; ++i) {
    int64_t w = lcmac_cuda_workspace_bytes(b->kernels[i].h);
    if (w > kws) kws = w;
  }
  for (int i = 0; i < b->nrules; ++i) {
    const BRule* r = &b->rules[i];
    int64_t P = r->rows[r->nrows - 1];
    if (r->kind == BR_ROWS && round256(P * r->K * sz) + P * r->N * sz > pad)
      pad = round256(P * r->K * sz) + P * r->N * sz;
  }
  b->kernel_ws_bytes = round256(kws);
  b->ws_bytes = b->kernel_ws_bytes + pad;
  lcmac_handle* h = b->kernels[0].h;
  CUresult_t r = cu.CtxPush((CUcontext_t)h->cu_ctx);
  if (r == CU_SUCCESS) {
    r = cu.MemAlloc(&b->d_ws, (size_t)(b->ws_bytes > 256 ? b->ws_bytes : 256));
    cu_leave();
  }
  if (r != CU_SUCCESS) {
    b->d_ws = 0;
    put_err(err, errlen, "%s: cannot allocate the bundle's %lld-byte workspace on CUDA device %d: "
            "%s", who, (long long)b->ws_bytes, b->device, cu_str(r));
    return LCMAC_ELOAD;
  }
  return LCMAC_OK;
}

int64_t lcmac_bundle_cuda_workspace_bytes(const lcmac_bundle* b) {
  return b && b->device >= 0 ? b->ws_bytes : -1;
}

int lcmac_bundle_device(const lcmac_bundle* b) {
  return b ? b->device : -1;
}

static int bundle_cuda_call(lcmac_bundle* b, int kernel, const void* A, const void* B, void* C,
                            char* ws, CUstream_t stream) {
  BKernel* k = &b->kernels[kernel];
  int rc = lcmac_cuda_matmul(k->h, A, B, C, k->M, k->N, k->K, b->dtype, ws,
                             (size_t)b->kernel_ws_bytes, stream);
  if (rc)
    put_err(b->err, sizeof b->err, "lcmac_bundle_cuda_matmul: kernel %s: %s", k->name,
             lcmac_last_error(k->h));
  return rc;
}

/* stream-ordered zeroing and copying of the padding (the handle's context current) */
static int cuda_pad_op(lcmac_bundle* b, lcmac_handle* h, CUresult_t r) {
  if (r == CU_SUCCESS) return LCMAC_OK;
  put_err(b->err, sizeof b->err, "lcmac_bundle_cuda_matmul: copying the padded rows on CUDA "
           "device %d failed: %s", h->device, cu_str(r));
  return LCMAC_EKERNEL;
}

static int bundle_cuda_context(lcmac_bundle* b, lcmac_handle* h) {
  put_err(b->err, sizeof b->err, "lcmac_bundle_cuda_matmul: %s", h->err);
  return LCMAC_EKERNEL;
}

static int run_rows_cuda(lcmac_bundle* b, const BRule* r, const char* A, const void* B, char* C,
                         int64_t M, int64_t N, int64_t K, size_t sz, char* ws, CUstream_t stream) {
  int64_t start = 0;
  int rc;
  for (int j = 0; j < r->nrows; ++j)
    for (int64_t P = r->rows[j]; M - start >= P; start += P)
      if ((rc = bundle_cuda_call(b, r->bucket[j], A + (size_t)start * K * sz, B,
                                 C + (size_t)start * N * sz, ws, stream)))
        return rc;
  if (start == M) return LCMAC_OK;
  int64_t P = r->rows[r->nrows - 1], rows = M - start;
  CUdeviceptr_t pa = (CUdeviceptr_t)(uintptr_t)(ws + b->kernel_ws_bytes);
  CUdeviceptr_t pc = pa + (CUdeviceptr_t)round256(P * K * (int64_t)sz);
  lcmac_handle* h = b->kernels[r->bucket[r->nrows - 1]].h;
  if ((rc = cu_enter(h))) return bundle_cuda_context(b, h);
  rc = cuda_pad_op(b, h, cu.MemsetD8Async(pa + (size_t)rows * K * sz, 0, (size_t)(P - rows) * K * sz,
                                          stream));
  if (!rc)
    rc = cuda_pad_op(b, h, cu.MemcpyDtoDAsync(pa, (CUdeviceptr_t)(uintptr_t)(A + (size_t)start * K * sz),
                                              (size_t)rows * K * sz, stream));
  cu_leave();
  if (rc || (rc = bundle_cuda_call(b, r->bucket[r->nrows - 1], (void*)(uintptr_t)pa, B,
                                   (void*)(uintptr_t)pc, ws, stream)))
    return rc;
  if ((rc = cu_enter(h))) return bundle_cuda_context(b, h);
  rc = cuda_pad_op(b, h, cu.MemcpyDtoDAsync((CUdeviceptr_t)(uintptr_t)(C + (size_t)start * N * sz), pc,
                                            (size_t)rows * N * sz, stream));
  cu_leave();
  return rc;
}

int lcmac_bundle_cuda_matmul(lcmac_bundle* b, const void* A, const void* B, void* C, int64_t M,
                             int64_t N, int64_t K, int dtype, void* workspace,
                             size_t workspace_bytes, struct CUstream_st* stream) {
  static const char who[] = "lcmac_bundle_cuda_matmul";
  if (!b) {
    snprintf(tls_null_error, sizeof tls_null_error, "%s: the bundle is NULL", who);
    return LCMAC_EINVAL;
  }
  pthread_mutex_lock(&b->mu);
  int ri = -1;
  int rc = bundle_args(b, who, 1, A, B, C, M, N, K, dtype, &ri);
  size_t sz = dtype_bytes(dtype);
  if (rc == LCMAC_OK && workspace && (int64_t)workspace_bytes < b->ws_bytes) {
    put_err(b->err, sizeof b->err, "%s: the workspace has %zu bytes and the bundle needs %lld "
             "(lcmac_bundle_cuda_workspace_bytes)", who, workspace_bytes, (long long)b->ws_bytes);
    rc = LCMAC_EINVAL;
  }
  if (rc == LCMAC_OK) {
    /* the whole operands, before any piece runs: a short buffer is refused, not half-written */
    size_t na = (size_t)M * K * sz, nb = (size_t)K * N * sz, nc = (size_t)M * N * sz;
    lcmac_handle* h = b->kernels[0].h;
    if ((rc = cu_enter(h))) {
      bundle_cuda_context(b, h);
    } else {
      if ((rc = check_device_buffer(h, who, "A", A, na)) ||
          (rc = check_device_buffer(h, who, "B", B, nb)) ||
          (rc = check_device_buffer(h, who, "C", C, nc)) ||
          (workspace && (rc = check_device_buffer(h, who, "the workspace", workspace,
                                                  (size_t)b->ws_bytes))))
        put_err(b->err, sizeof b->err, "%s", h->err);
      cu_leave();
    }
    if (rc == LCMAC_OK && (overlaps(C, nc, A, na) || overlaps(C, nc, B, nb))) {
      put_err(b->err, sizeof b->err, "%s: C overlaps %s in memory", who,
               overlaps(C, nc, A, na) ? "A" : "B");
      rc = LCMAC_EINVAL;
    } else if (rc == LCMAC_OK) {
      const BRule* r = &b->rules[ri];
      char* ws = workspace ? (char*)workspace : (char*)(uintptr_t)b->d_ws;
      rc = r->kind == BR_EXACT ? bundle_cuda_call(b, r->bucket[0], A, B, C, ws, stream)
                               : run_rows_cuda(b, r, (const char*)A, B, (char*)C, M, N, K, sz, ws,
                                               stream);
    }
  }
  if (rc == LCMAC_OK) b->err[0] = 0;
  pthread_mutex_unlock(&b->mu);
  return rc;
}
