/*
 * lcmac_cuda.c — CUDA artifacts from C (lcmac_open_cuda_artifact, lcmac_cuda_matmul and the
 * prepared-B entry points of lcmac.h).  #included by lcmac_c.c after the CPU artifact API.
 *
 * A CUDA artifact's library (built by lcmac.targets.tilelang_worker with nvcc) links the CUDA
 * runtime statically and exports
 *     int lcmac_init(void);  int lcmac_run(A, B, C, workspace, stream);
 *     const char* lcmac_last_error(void);  long long lcmac_workspace_bytes(void);
 *     long long lcmac_prepared_b_bytes(void);  int lcmac_prepare_b(B, P, stream);
 *     int lcmac_run_prepared(A, P, C, workspace, stream);
 * (lcmac/targets/cuda.py writes them).  Its runtime launches on the context current to the
 * calling thread, so every call here pushes the handle's device's primary context (the one the
 * CUDA runtime of the program shares) and pops it afterwards: the caller's current device is
 * left as it was.
 *
 * What the harness itself needs of the GPU (the compute capability before anything is loaded,
 * where a pointer lives and how large its allocation is, the stream's context, the workspace
 * and padding allocations, the padding copies) it takes from the driver API, libcuda.so.1,
 * opened with dlopen when the first CUDA artifact is opened: the harness compiles with no CUDA
 * headers and a CPU-only program never needs the driver.  Only driver entry points that have
 * kept their ABI since CUDA 11 are used, by their versioned names.
 */

/* ---- the driver API, as much of cuda.h as is used ---- */
typedef int CUresult_t;
typedef int CUdevice_t;
typedef struct CUctx_st* CUcontext_t;
typedef unsigned long long CUdeviceptr_t;
typedef struct CUstream_st* CUstream_t;

enum {
  CU_SUCCESS = 0,
  CU_ATTR_CC_MAJOR = 75,           /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
  CU_ATTR_CC_MINOR = 76,
  CU_PTR_MEMORY_TYPE = 2,          /* CU_POINTER_ATTRIBUTE_* */
  CU_PTR_DEVICE_ORDINAL = 9,
  CU_PTR_RANGE_START = 11,
  CU_PTR_RANGE_SIZE = 12,
  CU_MEM_HOST = 1,                 /* CU_MEMORYTYPE_* */
  CU_MEM_DEVICE = 2,
  CU_MEM_UNIFIED = 4
};

static struct {
  char why[512];                   /* "" once loaded and initialised */
  CUresult_t (*Init)(unsigned);
  CUresult_t (*DeviceGetCount)(int*);
  CUresult_t (*DeviceGet)(CUdevice_t*, int);
  CUresult_t (*DeviceGetAttribute)(int*, int, CUdevice_t);
  CUresult_t (*DeviceGetName)(char*, int, CUdevice_t);
  CUresult_t (*PrimaryCtxRetain)(CUcontext_t*, CUdevice_t);
  CUresult_t (*PrimaryCtxRelease)(CUdevice_t);
  CUresult_t (*CtxPush)(CUcontext_t);
  CUresult_t (*CtxPop)(CUcontext_t*);
  CUresult_t (*MemAlloc)(CUdeviceptr_t*, size_t);
  CUresult_t (*MemFree)(CUdeviceptr_t);
  CUresult_t (*MemsetD8Async)(CUdeviceptr_t, unsigned char, size_t, CUstream_t);
  CUresult_t (*MemcpyDtoDAsync)(CUdeviceptr_t, CUdeviceptr_t, size_t, CUstream_t);
  CUresult_t (*PointerGetAttribute)(void*, int, CUdeviceptr_t);
  CUresult_t (*StreamGetCtx)(CUstream_t, CUcontext_t*);
  CUresult_t (*GetErrorString)(CUresult_t, const char**);
} cu;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_load(void) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    snprintf(cu.why, sizeof cu.why, "no CUDA driver on this machine (%s)",
             e ? e : "libcuda.so.1 not found");
    return;
  }
  struct { void** slot; const char* name; } syms[] = {
    {(void**)&cu.Init, "cuInit"}, {(void**)&cu.DeviceGetCount, "cuDeviceGetCount"},
    {(void**)&cu.DeviceGet, "cuDeviceGet"}, {(void**)&cu.DeviceGetAttribute, "cuDeviceGetAttribute"},
    {(void**)&cu.DeviceGetName, "cuDeviceGetName"},
    {(void**)&cu.PrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
    {(void**)&cu.PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
    {(void**)&cu.CtxPush, "cuCtxPushCurrent_v2"}, {(void**)&cu.CtxPop, "cuCtxPopCurrent_v2"},
    {(void**)&cu.MemAlloc, "cuMemAlloc_v2"}, {(void**)&cu.MemFree, "cuMemFree_v2"},
    {(void**)&cu.MemsetD8Async, "cuMemsetD8Async"},
    {(void**)&cu.MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"},
    {(void**)&cu.PointerGetAttribute, "cuPointerGetAttribute"},
    {(void**)&cu.StreamGetCtx, "cuStreamGetCtx"}, {(void**)&cu.GetErrorString, "cuGetErrorString"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; ++i)
    if (!(*syms[i].slot = dlsym(lib, syms[i].name))) {
      snprintf(cu.why, sizeof cu.why, "the CUDA driver (libcuda.so.1) lacks %s: it is older "
               "than CUDA 11; update the driver", syms[i].name);
      return;
    }
  CUresult_t r = cu.Init(0);
  if (r != CU_SUCCESS) {
    const char* s = NULL;
    cu.GetErrorString(r, &s);
    snprintf(cu.why, sizeof cu.why, "the CUDA driver does not start (cuInit: %s)",
             s ? s : "unknown error");
  }
}

static const char* cu_str(CUresult_t r) {
  const char* s = NULL;
  if (cu.GetErrorString) cu.GetErrorString(r, &s);
  return s ? s : "unknown CUDA error";
}

/* "sm_90a" runs on compute capability 9.0 only (arch-specific features); "sm_80" on 8.x, x >= 0
 * (as lcmac.runtime.cuda_loader._cc_ok).  -1 for an arch string it cannot read. */
static int arch_runs_on(const char* arch, int major, int minor) {
  if (strncmp(arch, "sm_", 3)) return -1;
  const char* d = arch + 3;
  size_t n = strspn(d, "0123456789");
  if (n < 2 || (d[n] && strcmp(d + n, "a"))) return -1;
  int want_major = 0;
  for (size_t i = 0; i + 1 < n; ++i) want_major = want_major * 10 + (d[i] - '0');
  int want_minor = d[n - 1] - '0';
  if (d[n] == 'a') return major == want_major && minor == want_minor;
  return major == want_major && minor >= want_minor;
}

/* The driver is there, `device` exists and runs `arch`: LCMAC_OK, or LCMAC_ETARGET /
 * LCMAC_EINVAL with a message. */
static int check_gpu(const char* who, const char* arch, int device, char* err, size_t errlen) {
  pthread_once(&cu_once, cu_load);
  if (cu.why[0]) {
    put_err(err, errlen, "%s: %s; a CUDA artifact needs an NVIDIA GPU and its driver", who, cu.why);
    return LCMAC_ETARGET;
  }
  int count = 0;
  CUresult_t r = cu.DeviceGetCount(&count);
  if (r != CU_SUCCESS) {
    put_err(err, errlen, "%s: cannot count the CUDA devices: %s", who, cu_str(r));
    return LCMAC_ETARGET;
  }
  if (device < 0) {
    put_err(err, errlen, "%s: device %d is not a device ordinal (0 to %d)", who, device, count - 1);
    return LCMAC_EINVAL;
  }
  if (device >= count) {
    put_err(err, errlen, "%s: there is no CUDA device %d: this machine has %d", who, device, count);
    return LCMAC_ETARGET;
  }
  CUdevice_t dev;
  int major = 0, minor = 0;
  char name[128] = "?";
  if ((r = cu.DeviceGet(&dev, device)) != CU_SUCCESS ||
      (r = cu.DeviceGetAttribute(&major, CU_ATTR_CC_MAJOR, dev)) != CU_SUCCESS ||
      (r = cu.DeviceGetAttribute(&minor, CU_ATTR_CC_MINOR, dev)) != CU_SUCCESS) {
    put_err(err, errlen, "%s: cannot query CUDA device %d: %s", who, device, cu_str(r));
    return LCMAC_ETARGET;
  }
  cu.DeviceGetName(name, (int)sizeof name, dev);
  int ok = arch_runs_on(arch, major, minor);
  if (ok < 0) {
    put_err(err, errlen, "%s: the manifest's CUDA arch \"%s\" is not of the form sm_XY or sm_XYa",
            who, arch);
    return LCMAC_EFORMAT;
  }
  if (!ok) {
    put_err(err, errlen, "%s: the artifact is built for %s, which does not run on CUDA device %d "
            "(%s, compute capability %d.%d); rebuild it for this GPU (lcmac build --target cuda)",
            who, arch, device, name, major, minor);
    return LCMAC_ETARGET;
  }
  return LCMAC_OK;
}

/* the handle's device current while a call runs */
static int cu_enter(lcmac_handle* h) {
  CUresult_t r = cu.CtxPush((CUcontext_t)h->cu_ctx);
  if (r != CU_SUCCESS) {
    snprintf(h->err, sizeof h->err, "cannot make CUDA device %d current: %s", h->device, cu_str(r));
    return LCMAC_EKERNEL;
  }
  return LCMAC_OK;
}

static void cu_leave(void) {
  CUcontext_t c;
  cu.CtxPop(&c);
}

/* ---- opening ---- */

typedef int (*LcmacRun)(const void*, const void*, void*, void*, void*);

/* Load a checked CUDA library (the GPU checked too) on `device`: its entry points, lcmac_init,
 * the workspace.  NULL with *status and a message on failure. */
static lcmac_handle* open_cuda_library(const char* who, const ArtifactInfo* a, int device,
                                       int* status, char* err, size_t errlen) {
  *status = LCMAC_ELOAD;
  lcmac_handle* h = new_handle(who, a->lib, err, errlen);
  if (!h) return NULL;
  void* lib = h->lib;
  h->device = device;
  snprintf(h->entry, sizeof h->entry, "%s", a->entry);
  int (*init)(void) = (int (*)(void))dlsym(lib, "lcmac_init");
  long long (*ws)(void) = (long long (*)(void))dlsym(lib, "lcmac_workspace_bytes");
  h->cu_run = (LcmacRun)dlsym(lib, a->entry);
  h->cu_last_error = (const char* (*)(void))dlsym(lib, "lcmac_last_error");
  if (!init || !ws || !h->cu_run || !h->cu_last_error) {
    put_err(err, errlen, "%s: %s is not an lcmac CUDA library: it lacks %s", who, a->lib,
            !init ? "lcmac_init" : !ws ? "lcmac_workspace_bytes"
            : !h->cu_run ? a->entry : "lcmac_last_error");
    lcmac_close(h);
    return NULL;
  }
  /* prepared B: artifacts built before it lack these (then LCMAC_EINVAL when asked) */
  long long (*pb)(void) = (long long (*)(void))dlsym(lib, "lcmac_prepared_b_bytes");
  h->cu_prepare_b = (int (*)(const void*, void*, void*))dlsym(lib, "lcmac_prepare_b");
  h->cu_run_prepared = (LcmacRun)dlsym(lib, "lcmac_run_prepared");
  h->cu_prepared_bytes = pb && h->cu_prepare_b && h->cu_run_prepared ? pb() : -2;
  h->cu_run_batched = (int (*)(const void*, const void*, void*, long long, void*, void*))dlsym(
      lib, "lcmac_run_batched");
  h->cu_ws_bytes = ws();
  if (h->cu_ws_bytes < 0 || (a->ws_bytes >= 0 && a->ws_bytes != h->cu_ws_bytes)) {
    put_err(err, errlen, "%s: %s asks for %lld bytes of workspace and its manifest records %lld: "
            "the library is not the manifest's; rebuild the artifact", who, a->lib,
            (long long)h->cu_ws_bytes, (long long)a->ws_bytes);
    *status = LCMAC_ECORRUPT;
    lcmac_close(h);
    return NULL;
  }
  CUdevice_t dev;
  CUresult_t r = cu.DeviceGet(&dev, device);
  if (r == CU_SUCCESS) r = cu.PrimaryCtxRetain((CUcontext_t*)&h->cu_ctx, dev);
  if (r != CU_SUCCESS) {
    put_err(err, errlen, "%s: cannot use CUDA device %d: %s", who, device, cu_str(r));
    h->cu_ctx = NULL;
    lcmac_close(h);
    return NULL;
  }
  if (cu_enter(h)) {
    put_err(err, errlen, "%s: %s", who, h->err);
    lcmac_close(h);
    return NULL;
  }
  int rc = init();
  CUdeviceptr_t p = 0;
  r = rc ? CU_SUCCESS : cu.MemAlloc(&p, (size_t)(h->cu_ws_bytes > 256 ? h->cu_ws_bytes : 256));
  cu_leave();
  if (rc) {
    put_err(err, errlen, "%s: lcmac_init of %s failed on device %d: %s", who, a->lib, device,
            h->cu_last_error());
    lcmac_close(h);
    return NULL;
  }
  if (r != CU_SUCCESS) {
    put_err(err, errlen, "%s: cannot allocate the %lld-byte workspace on CUDA device %d: %s", who,
            (long long)h->cu_ws_bytes, device, cu_str(r));
    lcmac_close(h);
    return NULL;
  }
  h->cu_ws = p;
  *status = LCMAC_OK;
  return h;
}

lcmac_handle* lcmac_open_cuda_artifact(const char* manifest_path, int device, int* status,
                                       char* err, size_t errlen) {
  return open_checked("lcmac_open_cuda_artifact", manifest_path, 1, device, 0, status, err,
                      errlen);
}

/* ---- checking a call's arguments ---- */

static size_t dtype_bytes(int dtype) {
  DLDataType t;
  return dtype_of(dtype, &t) ? 0 : t.bits / 8;
}

/* `p` is CUDA memory of h's device holding at least `bytes` from p, 16-byte aligned (the
 * kernels read and write it with TMA): LCMAC_OK, or LCMAC_EINVAL with a message naming `what`. */
static int check_device_buffer(lcmac_handle* h, const char* who, const char* what, const void* p,
                               size_t bytes) {
  CUdeviceptr_t d = (CUdeviceptr_t)(uintptr_t)p, start = 0;
  unsigned int type = 0;
  int ordinal = -1;
  size_t size = 0;
  CUresult_t r = cu.PointerGetAttribute(&type, CU_PTR_MEMORY_TYPE, d);
  if (r != CU_SUCCESS || (type != CU_MEM_DEVICE && type != CU_MEM_UNIFIED)) {
    snprintf(h->err, sizeof h->err, "%s: %s (%p) is %s; pass memory from cudaMalloc on device %d",
             who, what, p, r != CU_SUCCESS ? "not CUDA memory (host memory from malloc?)"
             : type == CU_MEM_HOST ? "page-locked host memory, not device memory"
             : "not device memory", h->device);
    return LCMAC_EINVAL;
  }
  if (cu.PointerGetAttribute(&ordinal, CU_PTR_DEVICE_ORDINAL, d) == CU_SUCCESS &&
      ordinal != h->device) {
    snprintf(h->err, sizeof h->err, "%s: %s is memory of CUDA device %d; this handle runs on "
             "device %d", who, what, ordinal, h->device);
    return LCMAC_EINVAL;
  }
  if (cu.PointerGetAttribute(&start, CU_PTR_RANGE_START, d) == CU_SUCCESS &&
      cu.PointerGetAttribute(&size, CU_PTR_RANGE_SIZE, d) == CU_SUCCESS &&
      d - start + bytes > size) {
    snprintf(h->err, sizeof h->err, "%s: %s needs %zu bytes and its allocation holds %llu from "
             "that address", who, what, bytes, (unsigned long long)(start + size - d));
    return LCMAC_EINVAL;
  }
  if (d % 16) {
    snprintf(h->err, sizeof h->err, "%s: %s (%p) is not 16-byte aligned, which the kernels' "
             "tensor-memory copies need", who, what, p);
    return LCMAC_EINVAL;
  }
  return LCMAC_OK;
}

/* Everything of a CUDA call on h (a CUDA handle, its context current) but the operands:
 * sizes, dtype, stream, workspace. */
static int check_cuda_call(lcmac_handle* h, const char* who, int64_t M, int64_t N, int64_t K,
                           int dtype, void* workspace, size_t workspace_bytes, CUstream_t stream) {
  if (M != h->M || N != h->N || K != h->K) {
    snprintf(h->err, sizeof h->err, "%s: shape M=%lld N=%lld K=%lld is not the artifact's "
             "M=%lld N=%lld K=%lld (its manifest's shape)", who, (long long)M, (long long)N,
             (long long)K, (long long)h->M, (long long)h->N, (long long)h->K);
    return LCMAC_EINVAL;
  }
  if (dtype != h->dtype) {
    snprintf(h->err, sizeof h->err, "%s: dtype %s is not the artifact's %s", who,
             dtype_name(dtype), dtype_name(h->dtype));
    return LCMAC_EINVAL;
  }
  CUcontext_t ctx = NULL;
  CUresult_t r = cu.StreamGetCtx(stream, &ctx);
  if (r != CU_SUCCESS) {
    snprintf(h->err, sizeof h->err, "%s: the stream %p is not a CUDA stream: %s", who,
             (void*)stream, cu_str(r));
    return LCMAC_EINVAL;
  }
  if (ctx != (CUcontext_t)h->cu_ctx) {
    snprintf(h->err, sizeof h->err, "%s: the stream belongs to another device or context than "
             "this handle's (CUDA device %d's primary context)", who, h->device);
    return LCMAC_EINVAL;
  }
  if (workspace) {
    if ((int64_t)workspace_bytes < h->cu_ws_bytes) {
      snprintf(h->err, sizeof h->err, "%s: the workspace has %zu bytes and the artifact needs "
               "%lld (lcmac_cuda_workspace_bytes)", who, workspace_bytes, (long long)h->cu_ws_bytes);
      return LCMAC_EINVAL;
    }
    return check_device_buffer(h, who, "the workspace", workspace, (size_t)h->cu_ws_bytes);
  }
  return LCMAC_OK;
}

/* A, B (named `bname`) and C of na, nb and nc bytes: each a device buffer of h's device
 * (check_device_buffer), and C overlapping neither. */
static int check_operands(lcmac_handle* h, const char* who, const void* A, size_t na,
                          const void* B, size_t nb, const char* bname, void* C, size_t nc) {
  int rc;
  if ((rc = check_device_buffer(h, who, "A", A, na)) ||
      (rc = check_device_buffer(h, who, bname, B, nb)) ||
      (rc = check_device_buffer(h, who, "C", C, nc)))
    return rc;
  if (overlaps(C, nc, A, na) || overlaps(C, nc, B, nb)) {
    snprintf(h->err, sizeof h->err, "%s: C overlaps %s in memory", who,
             overlaps(C, nc, A, na) ? "A" : bname);
    return LCMAC_EINVAL;
  }
  return LCMAC_OK;
}

/* the library's failure as the handle's message */
static int cuda_failed(lcmac_handle* h, const char* who, int rc) {
  snprintf(h->err, sizeof h->err, "%s: the kernel launch failed (%d): %s", who, rc,
           h->cu_last_error());
  return LCMAC_EKERNEL;
}

/* C = A·B, or with `prepared` A·P (P from lcmac_cuda_prepare_b), on the caller's stream.  The
 * checks run with the handle's context current: the driver resolves the default stream and
 * pointer attributes against it. */
static int cuda_matmul(lcmac_handle* h, const char* who, int prepared, const void* A,
                       const void* B, void* C, int64_t M, int64_t N, int64_t K, int dtype,
                       void* workspace, size_t workspace_bytes, CUstream_t stream) {
  if (!h) return null_handle(who);
  pthread_mutex_lock(&h->call_mu);
  size_t sz = dtype_bytes(dtype);
  const char* bname = prepared ? "the prepared B" : "B";
  int rc = LCMAC_EINVAL;
  if (!A || !B || !C) {
    snprintf(h->err, sizeof h->err, "%s: %s is NULL", who, !A ? "A" : !B ? bname : "C");
  } else if (!sz) {
    snprintf(h->err, sizeof h->err, "%s: unknown dtype code %d (see lcmac_dtype)", who, dtype);
  } else if (h->device < 0) {
    snprintf(h->err, sizeof h->err, "%s: this handle holds a CPU artifact; call lcmac_matmul "
             "with host pointers", who);
  } else if (h->cu_run_batched) {
    snprintf(h->err, sizeof h->err, "%s: this artifact multiplies batches of products; call "
             "lcmac_cuda_bmm", who);
  } else if (prepared && h->cu_prepared_bytes < 0) {
    snprintf(h->err, sizeof h->err, "%s: this artifact's B cannot be prepared (%s)", who,
             h->cu_prepared_bytes == -2 ? "it was built before prepared B: rebuild it"
             : "lcmac_cuda_prepare_b says why");
  } else if ((rc = cu_enter(h)) == LCMAC_OK) {
    size_t na = (size_t)M * K * sz, nc = (size_t)M * N * sz;
    size_t nb = prepared ? (size_t)h->cu_prepared_bytes : (size_t)K * N * sz;
    if (!(rc = check_cuda_call(h, who, M, N, K, dtype, workspace, workspace_bytes, stream)) &&
        !(rc = check_operands(h, who, A, na, B, nb, bname, C, nc))) {
      void* ws = workspace ? workspace : (void*)(uintptr_t)h->cu_ws;
      int r = (prepared ? h->cu_run_prepared : h->cu_run)(A, B, C, ws, (void*)stream);
      rc = r ? cuda_failed(h, who, r) : LCMAC_OK;
    }
    cu_leave();
  }
  if (rc == LCMAC_OK) h->err[0] = 0;
  pthread_mutex_unlock(&h->call_mu);
  return rc;
}

int lcmac_cuda_matmul(lcmac_handle* h, const void* A, const void* B, void* C, int64_t M,
                      int64_t N, int64_t K, int dtype, void* workspace, size_t workspace_bytes,
                      struct CUstream_st* stream) {
  return cuda_matmul(h, "lcmac_cuda_matmul", 0, A, B, C, M, N, K, dtype, workspace,
                     workspace_bytes, stream);
}

int lcmac_cuda_matmul_prepared(lcmac_handle* h, const void* A, const void* P, void* C, int64_t M,
                               int64_t N, int64_t K, int dtype, void* workspace,
                               size_t workspace_bytes, struct CUstream_st* stream) {
  return cuda_matmul(h, "lcmac_cuda_matmul_prepared", 1, A, P, C, M, N, K, dtype, workspace,
                     workspace_bytes, stream);
}

int lcmac_cuda_bmm(lcmac_handle* h, const void* A, const void* B, void* C, int64_t batch,
                   int64_t M, int64_t N, int64_t K, int dtype, struct CUstream_st* stream) {
  static const char who[] = "lcmac_cuda_bmm";
  if (!h) return null_handle(who);
  pthread_mutex_lock(&h->call_mu);
  size_t sz = dtype_bytes(dtype);
  int rc = LCMAC_EINVAL;
  if (h->device < 0 || !h->cu_run_batched) {
    snprintf(h->err, sizeof h->err, "%s: this handle holds %s; build one with config "
             "{\"batched\": true} (lcmac.bmm builds them)", who,
             h->device < 0 ? "a CPU artifact" : "an artifact of one product (lcmac_cuda_matmul)");
  } else if (batch < 0 || batch > 2147483647LL) {
    snprintf(h->err, sizeof h->err, "%s: batch must be 0 .. 2^31-1, not %lld", who, (long long)batch);
  } else if (!sz) {
    snprintf(h->err, sizeof h->err, "%s: unknown dtype code %d (see lcmac_dtype)", who, dtype);
  } else if (batch > 0 && (!A || !B || !C)) {
    snprintf(h->err, sizeof h->err, "%s: %s is NULL", who, !A ? "A" : !B ? "B" : "C");
  } else if ((rc = cu_enter(h)) == LCMAC_OK) {
    size_t na = (size_t)batch * M * K * sz, nb = (size_t)batch * K * N * sz;
    size_t nc = (size_t)batch * M * N * sz;
    if (!(rc = check_cuda_call(h, who, M, N, K, dtype, NULL, 0, stream)) && batch > 0 &&
        !(rc = check_operands(h, who, A, na, B, nb, "B", C, nc))) {
      int r = h->cu_run_batched(A, B, C, (long long)batch, NULL, (void*)stream);
      rc = r ? cuda_failed(h, who, r) : LCMAC_OK;
    }
    cu_leave();
  }
  if (rc == LCMAC_OK) h->err[0] = 0;
  pthread_mutex_unlock(&h->call_mu);
  return rc;
}

int64_t lcmac_cuda_prepared_b_bytes(const lcmac_handle* h) {
  return h && h->device >= 0 && h->cu_prepared_bytes >= 0 ? h->cu_prepared_bytes : -1;
}

int lcmac_cuda_prepare_b(lcmac_handle* h, const void* B, void* P, size_t P_bytes,
                         struct CUstream_st* stream) {
  static const char who[] = "lcmac_cuda_prepare_b";
  if (!h) return null_handle(who);
  pthread_mutex_lock(&h->call_mu);
  int rc = LCMAC_EINVAL;
  if (!B || !P) {
    snprintf(h->err, sizeof h->err, "%s: %s is NULL", who, !B ? "B" : "P");
  } else if (h->device < 0) {
    snprintf(h->err, sizeof h->err, "%s: this handle holds a CPU artifact", who);
  } else if (h->cu_prepared_bytes == -2) {
    snprintf(h->err, sizeof h->err, "%s: this artifact was built before prepared B: rebuild it", who);
  } else if (h->cu_prepared_bytes < 0) {
    h->cu_prepare_b(NULL, NULL, NULL);   /* the library's reason, e.g. nothing reads B alone */
    snprintf(h->err, sizeof h->err, "%s: %s", who, h->cu_last_error());
  } else if (P_bytes < (size_t)h->cu_prepared_bytes) {
    snprintf(h->err, sizeof h->err, "%s: P has %zu bytes and the prepared B needs %lld "
             "(lcmac_cuda_prepared_b_bytes)", who, P_bytes, (long long)h->cu_prepared_bytes);
  } else if ((rc = cu_enter(h)) == LCMAC_OK) {
    size_t nb = (size_t)h->K * h->N * dtype_bytes(h->dtype), np = (size_t)h->cu_prepared_bytes;
    if (!(rc = check_cuda_call(h, who, h->M, h->N, h->K, h->dtype, NULL, 0, stream)) &&
        !(rc = check_device_buffer(h, who, "B", B, nb)) &&
        !(rc = check_device_buffer(h, who, "P", P, np))) {
      if (overlaps(P, np, B, nb)) {
        snprintf(h->err, sizeof h->err, "%s: P overlaps B in memory", who);
        rc = LCMAC_EINVAL;
      } else {
        int r = h->cu_prepare_b(B, P, (void*)stream);
        rc = r ? cuda_failed(h, who, r) : LCMAC_OK;
      }
    }
    cu_leave();
  }
  if (rc == LCMAC_OK) h->err[0] = 0;
  pthread_mutex_unlock(&h->call_mu);
  return rc;
}

int64_t lcmac_cuda_workspace_bytes(const lcmac_handle* h) {
  return h && h->device >= 0 ? h->cu_ws_bytes : -1;
}

int lcmac_device_of(const lcmac_handle* h) {
  return h ? h->device : -1;
}

/* lcmac_close's share for a CUDA handle: the workspace and the retained context */
static void close_cuda(lcmac_handle* h) {
  if (h->cu_ctx) {
    if (h->cu_ws && cu.CtxPush((CUcontext_t)h->cu_ctx) == CU_SUCCESS) {
      cu.MemFree(h->cu_ws);
      cu_leave();
    }
    CUdevice_t dev;
    if (cu.DeviceGet(&dev, h->device) == CU_SUCCESS) cu.PrimaryCtxRelease(dev);
  }
}
