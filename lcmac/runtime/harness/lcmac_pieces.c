/*
 * lcmac_pieces.c — the any-shape rule of a CPU bundle on piece kernels (formats
 * "lcmac-bundle/3" and "/2", lcmac.artifact.bundle): reading the rule's "pieces", cutting a
 * shape and running it as lcmac/spec/shape_rules.py (plan_pieces) and
 * lcmac/runtime/bundle_pieces.py (run_pieces) do, the same pieces in the same order, so that
 * C's result is Python's bit for bit.
 *
 * A piece kernel (P_M, P_N, P_K) computes C (+)= A.B on row-strided views of the caller's
 * arrays: in /3 any rows up to P_M and any depth up to P_K that are multiples of the rule's
 * run_time units, in /2 exactly its shape.  M and K are cut into spans of the largest size and
 * one shorter span that may overlap its predecessor (/2: like N), N into spans of its ladder
 * with one last span overlapping its neighbour.  The first K span of a C block writes it, the
 * others add into it; a K span overlapping its predecessor reads a copy of A's columns (or of
 * B's rows, whichever is smaller) whose overlapped part is zero.  A product the plan gives to
 * the vendor GEMM (small, or thin in a dimension) runs on a CBLAS where one is found (the
 * library LCMAC_BLAS names, else the program's cblas_sgemm/cblas_dgemm, as for vendor-base
 * artifacts), else on a plain loop in the bundle's dtype.
 *
 * #included by lcmac_bundle.c after its index helpers.
 */

/* lcmac/spec/shape_rules.py: PIECE_MIN_EXTENT, VENDOR_WORK, SPAN_COST */
#define LCMAC_PIECE_MIN_EXTENT 128
#define LCMAC_PIECE_VENDOR_WORK ((int64_t)256 * 256 * 256)
#define LCMAC_PIECE_SPAN_COST 32

static void* bundle_scratch(lcmac_bundle* b, size_t bytes);

/* elements [start, start + size) of a dimension, run by the kernels of `kernel` (0: of size);
 * the first `overlap` of them were covered by an earlier span */
typedef struct { int64_t start, size, overlap, kernel; } PSpan;

static int64_t span_piece(const PSpan* s) { return s->kernel ? s->kernel : s->size; }

/* shape_rules.cut_run_time: spans of `most`, then one of the rest in whole units (overlapping
 * its predecessor where the rest is not); out holds extent / most + 2.  0 spans: the vendor's */
static int64_t cut_run_time(int64_t extent, int64_t most, int64_t unit, PSpan* out) {
  if (extent < (unit > LCMAC_PIECE_MIN_EXTENT ? unit : LCMAC_PIECE_MIN_EXTENT)) return 0;
  int64_t n = 0, pos = 0;
  for (; extent - pos > most; pos += most) out[n++] = (PSpan){pos, most, 0, most};
  int64_t tail = extent - pos, size = (tail + unit - 1) / unit * unit;
  if (size <= extent) {
    out[n++] = (PSpan){extent - size, size, size - tail, most};
  } else {   /* one short span, not whole units: the whole units, then the last unit again */
    size -= unit;
    out[n++] = (PSpan){0, size, 0, most};
    out[n++] = (PSpan){extent - unit, unit, unit - extent + size, most};
  }
  return n;
}

/* shape_rules.cut_extent: a head of the greedy cut (largest first), then one span ending at
 * the extent, overlapping the head, at the least cost (elements computed + SPAN_COST a span;
 * the first of equal costs).  `ladder` descending; out holds extent / ladder[n-1] + 2. */
static int64_t cut_extent(int64_t extent, const int64_t* ladder, int n, PSpan* out) {
  int64_t ng = 0, pos = 0;
  for (int j = 0; j < n; ++j)
    for (; extent - pos >= ladder[j]; pos += ladder[j]) out[ng++] = (PSpan){pos, ladder[j], 0, 0};
  int64_t best = -1, best_keep = 0, best_p = 0;
  for (int64_t keep = 0; keep <= ng; ++keep) {
    int64_t done = keep ? out[keep - 1].start + out[keep - 1].size : 0, tail = extent - done;
    int64_t base = done + LCMAC_PIECE_SPAN_COST * keep;   /* the head's spans are contiguous */
    if (tail == 0) {
      if (best < 0 || base < best) best = base, best_keep = keep, best_p = 0;
      continue;
    }
    for (int j = 0; j < n; ++j) {
      int64_t P = ladder[j], cost = base + P + LCMAC_PIECE_SPAN_COST;
      if (tail <= P && P <= extent && (best < 0 || cost < best)) best = cost, best_keep = keep, best_p = P;
    }
  }
  if (best < 0) return 0;
  if (best_p) {
    int64_t done = best_keep ? out[best_keep - 1].start + out[best_keep - 1].size : 0;
    out[best_keep++] = (PSpan){extent - best_p, best_p, best_p - (extent - done), 0};
  }
  return best_keep;
}

typedef struct {
  PSpan* s[3];        /* M, N, K spans (one allocation, s[0]) */
  int64_t n[3];       /* their counts; any 0: the vendor GEMM runs the product */
} PPlan;

/* shape_rules.plan_pieces for the rule's ladders: 0, or -1 when out of memory */
static int plan_pieces(const BPieces* p, int64_t M, int64_t N, int64_t K, PPlan* pl) {
  int64_t ext[3] = {M, N, K}, cap[3], total = 0;
  memset(pl, 0, sizeof *pl);
  if (M * N < (LCMAC_PIECE_VENDOR_WORK + K - 1) / K) return 0;     /* M N K < VENDOR_WORK */
  for (int d = 0; d < 3; ++d) {
    int run_time = d != 1 && p->unit[0];
    cap[d] = ext[d] / (run_time ? p->size[d][0] : p->size[d][p->n[d] - 1]) + 2;
    total += cap[d];
  }
  if (!(pl->s[0] = (PSpan*)malloc((size_t)total * sizeof(PSpan)))) return -1;
  pl->s[1] = pl->s[0] + cap[0];
  pl->s[2] = pl->s[1] + cap[1];
  for (int d = 0; d < 3; ++d)
    pl->n[d] = d != 1 && p->unit[0] ? cut_run_time(ext[d], p->size[d][0], p->unit[d / 2], pl->s[d])
                                    : cut_extent(ext[d], p->size[d], p->n[d], pl->s[d]);
  return 0;
}

/* the ladder position of a piece size (-1: none, which a plan never makes) */
static int ladder_at(const BPieces* p, int d, int64_t size) {
  for (int j = 0; j < p->n[d]; ++j)
    if (p->size[d][j] == size) return j;
  return -1;
}

/* one piece: C (+)= A.B on views (rows x depth, depth x cols, rows x cols; row strides) */
static int piece_call(lcmac_bundle* b, int kernel, const char* a, int64_t lda, const char* bb,
                      int64_t ldb, char* c, int64_t ldc, int64_t rows, int64_t cols,
                      int64_t depth, int accumulate) {
  BKernel* k = &b->kernels[kernel];
  lcmac_handle* h = k->h;
  DLDataType dt = {2, (uint8_t)(b->dtype == LCMAC_FLOAT64 ? 64 : 32), 1};   /* float32, float64 */
  int64_t sa[2] = {rows, depth}, sb[2] = {depth, cols}, sc[2] = {rows, cols};
  int64_t ta[2] = {lda, 1}, tb[2] = {ldb, 1}, tc[2] = {ldc, 1};
  DLTensor t[3];
  TVMFFIAny args[4];
  tensor_arg(&t[0], &args[0], a, sa, dt);
  tensor_arg(&t[1], &args[1], bb, sb, dt);
  tensor_arg(&t[2], &args[2], c, sc, dt);
  t[0].strides = ta;
  t[1].strides = tb;
  t[2].strides = tc;
  memset(&args[3], 0, sizeof args[3]);
  args[3].type_index = kTVMFFIInt;
  args[3].v.v_int64 = accumulate;
  pthread_mutex_lock(&h->call_mu);
  int rc = lcmac_internal_call(h, args, 4);
  if (rc)
    put_err(b->err, sizeof b->err, "lcmac_bundle_matmul: piece kernel %s at %lldx%lldx%lld: %s",
            k->name, (long long)rows, (long long)cols, (long long)depth, h->err);
  pthread_mutex_unlock(&h->call_mu);
  return rc;
}

/* CBLAS's row-major, no-transpose GEMM (32-bit or 64-bit sizes; its enums are ints) */
enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111 };

/* C = A.B on the vendor GEMM: the CBLAS bound at open, else a plain loop in the dtype */
static void piece_vendor(lcmac_bundle* b, const char* A, const char* B, char* C, int64_t M,
                         int64_t N, int64_t K) {
  int f64 = b->dtype == LCMAC_FLOAT64;
  if (b->gemm[f64]) {
    /* alpha, beta by the C calling convention: float for sgemm, double for dgemm */
    if (f64 && b->gemm_ilp64)
      ((void (*)(int, int, int, int64_t, int64_t, int64_t, double, const double*, int64_t,
                 const double*, int64_t, double, double*, int64_t))b->gemm[1])(
          CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, M, N, K, 1.0, (const double*)A, K,
          (const double*)B, N, 0.0, (double*)C, N);
    else if (f64)
      ((void (*)(int, int, int, int, int, int, double, const double*, int, const double*, int,
                 double, double*, int))b->gemm[1])(
          CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, (int)M, (int)N, (int)K, 1.0,
          (const double*)A, (int)K, (const double*)B, (int)N, 0.0, (double*)C, (int)N);
    else if (b->gemm_ilp64)
      ((void (*)(int, int, int, int64_t, int64_t, int64_t, float, const float*, int64_t,
                 const float*, int64_t, float, float*, int64_t))b->gemm[0])(
          CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, M, N, K, 1.0f, (const float*)A, K,
          (const float*)B, N, 0.0f, (float*)C, N);
    else
      ((void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                 float, float*, int))b->gemm[0])(
          CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, (int)M, (int)N, (int)K, 1.0f,
          (const float*)A, (int)K, (const float*)B, (int)N, 0.0f, (float*)C, (int)N);
    return;
  }
  for (int64_t i = 0; i < M; ++i) {
    if (f64) {
      double* c = (double*)C + i * N;
      const double* a = (const double*)A + i * K;
      for (int64_t j = 0; j < N; ++j) c[j] = 0;
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < N; ++j) c[j] += a[k] * ((const double*)B)[k * N + j];
    } else {
      float* c = (float*)C + i * N;
      const float* a = (const float*)A + i * K;
      for (int64_t j = 0; j < N; ++j) c[j] = 0;
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < N; ++j) c[j] += a[k] * ((const float*)B)[k * N + j];
    }
  }
}

/* bundle_pieces.run_pieces: C = A.B (row-major, contiguous) through the rule's piece kernels */
static int run_pieces(lcmac_bundle* b, const BRule* r, const char* A, const char* B, char* C,
                      int64_t M, int64_t N, int64_t K, size_t sz) {
  const BPieces* p = &r->pc;
  PPlan pl;
  if (plan_pieces(p, M, N, K, &pl)) {
    put_err(b->err, sizeof b->err, "lcmac_bundle_matmul: out of memory for the plan of %lldx%lldx%lld",
            (long long)M, (long long)N, (long long)K);
    return LCMAC_EKERNEL;
  }
  int rc = LCMAC_OK;
  if (!pl.n[0] || !pl.n[1] || !pl.n[2]) {
    piece_vendor(b, A, B, C, M, N, K);
    free(pl.s[0]);
    return rc;
  }
  /* the K spans that overlap their predecessor: a zeroed copy of A's columns (M <= N) or of
     B's rows, at off[l] in the scratch (-1: none) */
  int64_t* off = (int64_t*)malloc((size_t)pl.n[2] * sizeof *off);
  size_t need = 0;
  for (int64_t l = 0; off && l < pl.n[2]; ++l) {
    off[l] = pl.s[2][l].overlap ? (int64_t)need : -1;
    if (pl.s[2][l].overlap) need += (size_t)(M <= N ? M : N) * (size_t)pl.s[2][l].size * sz;
  }
  char* s = off && need ? (char*)bundle_scratch(b, need) : NULL;
  if (!off || (need && !s)) {
    put_err(b->err, sizeof b->err, "lcmac_bundle_matmul: out of memory for the %zu bytes of "
            "zero-masked K spans", need);
    free(off);
    free(pl.s[0]);
    return LCMAC_EKERNEL;
  }
  for (int64_t l = 0; l < pl.n[2]; ++l) {
    const PSpan* k = &pl.s[2][l];
    if (off[l] < 0) continue;
    char* cp = s + off[l];
    if (M <= N) {
      for (int64_t i = 0; i < M; ++i) {
        char* row = cp + (size_t)(i * k->size) * sz;
        memset(row, 0, (size_t)k->overlap * sz);
        memcpy(row + (size_t)k->overlap * sz, A + (size_t)(i * K + k->start + k->overlap) * sz,
               (size_t)(k->size - k->overlap) * sz);
      }
    } else {
      memset(cp, 0, (size_t)(k->overlap * N) * sz);
      memcpy(cp + (size_t)(k->overlap * N) * sz, B + (size_t)((k->start + k->overlap) * N) * sz,
             (size_t)((k->size - k->overlap) * N) * sz);
    }
  }
  for (int64_t i = 0; i < pl.n[0] && !rc; ++i) {
    const PSpan* m = &pl.s[0][i];
    for (int64_t j = 0; j < pl.n[1] && !rc; ++j) {
      const PSpan* n = &pl.s[1][j];
      char* c = C + (size_t)(m->start * N + n->start) * sz;
      for (int64_t l = 0; l < pl.n[2] && !rc; ++l) {
        const PSpan* k = &pl.s[2][l];
        const char* a = A + (size_t)(m->start * K + k->start) * sz;
        const char* bb = B + (size_t)(k->start * N + n->start) * sz;
        int64_t lda = K;
        if (off[l] >= 0 && M <= N) {
          a = s + off[l] + (size_t)(m->start * k->size) * sz;
          lda = k->size;
        } else if (off[l] >= 0) {
          bb = s + off[l] + (size_t)n->start * sz;
        }
        int pi = ladder_at(p, 0, span_piece(m)), pj = ladder_at(p, 1, span_piece(n));
        int pk = ladder_at(p, 2, span_piece(k));
        if (pi < 0 || pj < 0 || pk < 0) {   /* the index was checked: not reached */
          put_err(b->err, sizeof b->err, "lcmac_bundle_matmul: the plan of %lldx%lldx%lld names "
                  "a piece outside the rule's ladders", (long long)M, (long long)N, (long long)K);
          rc = LCMAC_EINVAL;
          break;
        }
        rc = piece_call(b, p->kernel[(pi * p->n[1] + pj) * p->n[2] + pk], a, lda, bb, N, c, N,
                        m->size, n->size, k->size, l ? 1 : 0);
      }
    }
  }
  free(off);
  free(pl.s[0]);
  return rc;
}

/* ---- opening ---- */

/* A rule's "pieces" ({M, N, K: ladders, run_time: {M, K}} in /3) and its kernels, checked:
 * every (P_M, P_N, P_K) of the ladders one of the rule's kernels marked "piece". */
static int read_pieces(lcmac_bundle* b, Bctx* c, int r, BRule* br, const int* idx, int nk,
                       const char* where) {
  const lj_doc* d = c->d;
  static const char* dims[3] = {"M", "N", "K"};
  BPieces* p = &br->pc;
  int po = bfield(c, r, "pieces", where, LJ_OBJECT);
  if (po < 0) return LCMAC_EFORMAT;
  if (b->format < 2) return bfail(c, "%s has piece kernels, which format lcmac-bundle/1 has not", where);
  if (b->dtype != LCMAC_FLOAT32 && b->dtype != LCMAC_FLOAT64)
    return bfail(c, "%s: piece kernels serve float32 and float64, not %s", where, dtype_name(b->dtype));
  for (int q = 0; q < 3; ++q) {
    char w[200];
    snprintf(w, sizeof w, "%s: pieces", where);
    int la = bfield(c, po, dims[q], w, LJ_ARRAY);
    if (la < 0) return LCMAC_EFORMAT;
    p->n[q] = d->nodes[la].count;
    if (p->n[q] < 1 || p->n[q] > LCMAC_PIECE_MAX_LADDER)
      return bfail(c, "%s: pieces.%s must list 1 to %d sizes", where, dims[q], LCMAC_PIECE_MAX_LADDER);
    for (int j = 0; j < p->n[q]; ++j) {
      snprintf(w, sizeof w, "%s: pieces.%s[%d]", where, dims[q], j);
      if (bint(c, lj_at(d, la, j), w, &p->size[q][j])) return LCMAC_EFORMAT;
      if (p->size[q][j] > INT32_MAX) return bfail(c, "%s is above 2^31", w);
      if (j && p->size[q][j] >= p->size[q][j - 1])
        return bfail(c, "%s: pieces.%s is not strictly descending", where, dims[q]);
    }
  }
  int rt = lj_get(d, po, "run_time");
  if (rt == -2) return bfail(c, "%s: pieces: \"run_time\" occurs twice", where);
  if ((rt >= 0 && lj_kind(d, rt) != LJ_NULL) != (b->format == 3))
    return rt >= 0 && lj_kind(d, rt) != LJ_NULL
        ? bfail(c, "%s: its pieces have run-time extents (run_time), which format lcmac-bundle/2 "
                "has not", where)
        : bfail(c, "%s: its pieces lack the run_time units lcmac-bundle/3 gives them", where);
  p->unit[0] = p->unit[1] = 0;
  if (b->format == 3) {
    char w[200];
    snprintf(w, sizeof w, "%s: pieces.run_time", where);
    if (lj_kind(d, rt) != LJ_OBJECT || d->nodes[rt].count != 2)
      return bfail(c, "%s is not {M, K}", w);
    for (int q = 0; q < 2; ++q) {
      int u = bfield(c, rt, dims[2 * q], w, LJ_NUMBER);
      char what[220];
      snprintf(what, sizeof what, "%s.%s", w, dims[2 * q]);
      if (u < 0 || bint(c, u, what, &p->unit[q])) return LCMAC_EFORMAT;
      for (int j = 0; j < p->n[2 * q]; ++j)   /* so every span is whole units, none above P */
        if (p->size[2 * q][j] % p->unit[q])
          return bfail(c, "%s: pieces.%s size %lld is not a multiple of run_time.%s %lld", where,
                       dims[2 * q], (long long)p->size[2 * q][j], dims[2 * q], (long long)p->unit[q]);
    }
  }
  if (p->n[0] * p->n[1] * p->n[2] > LCMAC_BUNDLE_MAX_KERNELS)
    return bfail(c, "%s: its ladders make %d piece shapes, more than %d kernels", where,
                 p->n[0] * p->n[1] * p->n[2], LCMAC_BUNDLE_MAX_KERNELS);
  for (int i = 0; i < p->n[0]; ++i)
    for (int j = 0; j < p->n[1]; ++j)
      for (int l = 0; l < p->n[2]; ++l) {
        int64_t m = p->size[0][i], n = p->size[1][j], k = p->size[2][l];
        int* slot = &p->kernel[(i * p->n[1] + j) * p->n[2] + l];
        *slot = -1;
        for (int q = 0; q < nk && *slot < 0; ++q) {
          const BKernel* kk = &b->kernels[idx[q]];
          if (kk->piece && kk->M == m && kk->N == n && kk->K == k) *slot = idx[q];
        }
        if (*slot < 0)
          return bfail(c, "%s lists no %lldx%lldx%lld piece kernel (its ladders need one)", where,
                       (long long)m, (long long)n, (long long)k);
      }
  br->pieces = b->format;
  return LCMAC_OK;
}

/* After every kernel is open: a piece rule's kernels are piece kernels (their manifests say
 * so) whose run-time rows and depth take the rule's units, and no other rule calls one; then
 * the CBLAS for the vendor's products, where a piece rule needs one. */
static int pieces_open(lcmac_bundle* b, char* err, size_t errlen, const char* who) {
  int any = 0;
  for (int i = 0; i < b->nrules; ++i) {
    const BRule* r = &b->rules[i];
    const BPieces* p = &r->pc;
    int n = r->pieces ? p->n[0] * p->n[1] * p->n[2] : r->kind == BR_EXACT ? 1 : r->nrows;
    any |= r->pieces != 0;
    for (int q = 0; q < n; ++q) {
      const BKernel* k = &b->kernels[r->pieces ? p->kernel[q] : r->bucket[q]];
      const lcmac_handle* h = k->h;
      const char* why = NULL;
      if (!r->pieces && h->piece) why = "is a piece kernel (its manifest's entry_points[0].kind)";
      else if (r->pieces && !h->piece) why = "is not a piece kernel (its manifest's entry kind is not matmul_piece)";
      else if (r->pieces == 3 && (!h->piece_units[0] || !h->piece_units[1] ||
                                  p->unit[0] % h->piece_units[0] || p->unit[1] % h->piece_units[1]))
        why = "does not take the rule's run-time rows and depth (its manifest's extra.piece)";
      if (why) {
        put_err(err, errlen, "%s: kernel %s of the bundle %s %s, and rule %s %s it: the bundle was "
                "altered; build it again", who, k->name, b->dir, why, r->text,
                r->pieces ? "needs piece kernels for" : "calls whole products on");
        return LCMAC_EFORMAT;
      }
    }
  }
  const char* env = getenv("LCMAC_BLAS");
  if (!any) return LCMAC_OK;
  if (env && *env && !(b->blas = dlopen(env, RTLD_NOW | RTLD_LOCAL))) {
    put_err(err, errlen, "%s: LCMAC_BLAS=%s cannot be loaded: %s", who, env, dlerror());
    return LCMAC_ELOAD;
  }
  void* src = b->blas ? b->blas : RTLD_DEFAULT;
  static const char* const names[][2] = {{"cblas_%cgemm", "lp64"}, {"scipy_cblas_%cgemm64_", "ilp64"},
                                         {"cblas_%cgemm64_", "ilp64"}};
  for (int q = 0; q < 3 && !b->gemm[0]; ++q) {
    char s[64], dsym[64];
    snprintf(s, sizeof s, names[q][0], 's');
    snprintf(dsym, sizeof dsym, names[q][0], 'd');
    if ((b->gemm[0] = dlsym(src, s)) && (b->gemm[1] = dlsym(src, dsym)))
      b->gemm_ilp64 = !strcmp(names[q][1], "ilp64");
    else
      b->gemm[0] = b->gemm[1] = NULL;
  }
  return LCMAC_OK;
}
