/*
 * lcmac_bundle.c — bundles from C (lcmac_open_bundle / lcmac_bundle_matmul of lcmac.h): a
 * directory of bucket kernels with an index, DIR/bundle.json (format "lcmac-bundle/1", /2 or
 * /3, written by lcmac.artifact.bundle.build_bundle), serving shape rules:
 *
 *   exact:MxNxK   that kernel;
 *   rows:?xNxK    kernels (P, N, K) for P in the rule's "rows" (descending): the rows of A and
 *                 C are cut greedily, largest bucket first, as contiguous slices (no copy); the
 *                 rows left under the smallest bucket are copied into a zeroed P_min×K buffer,
 *                 run, and the first rows of the P_min×N result copied back;
 *   any:?x?x?     the row cut above over T_N×T_K tiles ("tile": [T_N, T_K]): tiles of A and B
 *                 copied into zeroed buffers, the products added into C (in a float32 buffer
 *                 for bfloat16 when K spans more than one tile, rounded once); or, with
 *                 "pieces" (/2, /3: a CPU bundle in float32 or float64), piece kernels on
 *                 views of A, B and C (lcmac_pieces.c).
 *
 * The same cut as lcmac/spec/shape_rules.py and lcmac/runtime/tiled.py, so C and Python give the
 * same results.  #included by lcmac_c.c after the artifact API, which opens every kernel.
 */

#define LCMAC_BUNDLE_FORMAT "lcmac-bundle/1"   /* and /2, /3: piece kernels (lcmac_pieces.c) */
#define LCMAC_BUNDLE_FORMATS "lcmac-bundle/1, lcmac-bundle/2 and lcmac-bundle/3"
#define LCMAC_BUNDLE_INDEX "bundle.json"
#define LCMAC_BUNDLE_MAX_INDEX (4 << 20)
#define LCMAC_BUNDLE_MAX_KERNELS 256
#define LCMAC_BUNDLE_MAX_RULES 64
#define LCMAC_BUNDLE_MAX_ROWS 32
#define LCMAC_PIECE_MAX_LADDER 16

enum { BR_EXACT = 0, BR_ROWS = 1, BR_ANY = 2 };

typedef struct {
  char name[201];
  int64_t M, N, K;
  int piece;                                /* the index marks it "piece": true */
  lcmac_handle* h;
} BKernel;

/* an any rule's piece ladders (lcmac_pieces.c) */
typedef struct {
  int n[3];                                 /* ladder lengths: M, N, K */
  int64_t size[3][LCMAC_PIECE_MAX_LADDER];  /* descending */
  int64_t unit[2];                          /* run_time's M and K; 0: fixed sizes (/2) */
  int kernel[LCMAC_BUNDLE_MAX_KERNELS];     /* per (i, j, l) of the ladders, row-major */
} BPieces;

typedef struct {
  int kind;
  char text[96];                            /* canonical rule text, as in the index */
  int64_t M, N, K;                          /* exact: all; rows: N, K */
  int nrows;
  int64_t rows[LCMAC_BUNDLE_MAX_ROWS];      /* descending */
  int64_t tn, tk;                           /* any: the tile */
  int bucket[LCMAC_BUNDLE_MAX_ROWS];        /* kernel index per row bucket (exact: bucket[0]) */
  int pieces;                               /* any: 0 tiles; 2, 3: piece kernels of that format */
  BPieces pc;
} BRule;

struct lcmac_bundle {
  char dir[PATH_MAX];
  int dtype;
  int format;                               /* 1, 2, 3: lcmac-bundle/<format> */
  void* blas;                               /* LCMAC_BLAS, dlopened (piece rules' vendor GEMM) */
  void* gemm[2];                            /* its (or the program's) ?gemm: float32, float64 */
  int gemm_ilp64;
  int nkernels, nrules;
  BKernel kernels[LCMAC_BUNDLE_MAX_KERNELS];
  BRule rules[LCMAC_BUNDLE_MAX_RULES];      /* in the order they are tried */
  pthread_mutex_t mu;                       /* one call at a time per bundle */
  void* scratch;                            /* padding buffers, grown as needed */
  size_t scratch_bytes;
  char err[LCMAC_ERRLEN];
  /* CUDA bundles (lcmac_open_cuda_bundle): the device, -1 for a CPU bundle */
  int device;
  int64_t kernel_ws_bytes;                  /* the largest kernel workspace */
  int64_t ws_bytes;                         /* that plus the largest rows rule's padding */
  unsigned long long d_ws;                  /* the bundle's own workspace (device memory) */
};

/* ---- opening ---- */

typedef struct { const lj_doc* d; const char* who; const char* path; char* err; size_t errlen; } Bctx;

static int bvfail(Bctx* c, int status, const char* fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  put_err(c->err, c->errlen, "%s: %s: %s", c->who, c->path, msg);
  return status;
}

/* the index is malformed: LCMAC_EFORMAT with a message */
static int bfail(Bctx* c, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = bvfail(c, LCMAC_EFORMAT, fmt, ap);
  va_end(ap);
  return rc;
}

/* the bundle is for another kind of device than the caller's: LCMAC_ETARGET */
static int btarget(Bctx* c, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = bvfail(c, LCMAC_ETARGET, fmt, ap);
  va_end(ap);
  return rc;
}

/* member key of obj of type want: its node, or -1 (message written) */
static int bfield(Bctx* c, int obj, const char* key, const char* where, lj_type want) {
  static const char* kinds[] = {"null", "true or false", "a number", "a string", "an array",
                                "an object"};
  int i = lj_get(c->d, obj, key);
  if (i == -1) { bfail(c, "%s: \"%s\" is missing", where, key); return -1; }
  if (i == -2) { bfail(c, "%s: \"%s\" occurs twice", where, key); return -1; }
  if (lj_kind(c->d, i) != want) {
    bfail(c, "%s: \"%s\" is not %s", where, key, kinds[want]);
    return -1;
  }
  return i;
}

static int bstring(Bctx* c, int obj, const char* key, const char* where, char* out, size_t cap) {
  int i = bfield(c, obj, key, where, LJ_STRING);
  if (i < 0) return -1;
  if (lj_str(c->d, i, out, cap)) { bfail(c, "%s: \"%s\" is too long or holds a NUL", where, key); return -1; }
  for (const char* p = out; *p; ++p)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) {
      bfail(c, "%s: \"%s\" holds a control character", where, key);
      return -1;
    }
  return 0;
}

static int bint(Bctx* c, int node, const char* what, int64_t* v) {
  if (lj_int(c->d, node, v) || *v < 1) {
    bfail(c, "%s is not a positive integer", what);
    return -1;
  }
  return 0;
}

/* the canonical rule text of the index: 0 and the rule's kind and sizes, or -1 */
static int parse_rule_text(const char* s, BRule* r) {
  long long m, n, k;
  int end = -1;
  if (!strcmp(s, "any:?x?x?")) { r->kind = BR_ANY; return 0; }
  if (sscanf(s, "rows:?x%lldx%lld%n", &n, &k, &end) == 2 && end == (int)strlen(s) && n > 0 && k > 0) {
    r->kind = BR_ROWS; r->N = n; r->K = k;
    return 0;
  }
  end = -1;
  if (sscanf(s, "exact:%lldx%lldx%lld%n", &m, &n, &k, &end) == 3 && end == (int)strlen(s) &&
      m > 0 && n > 0 && k > 0) {
    r->kind = BR_EXACT; r->M = m; r->N = n; r->K = k;
    return 0;
  }
  return -1;
}

static int find_kernel(const lcmac_bundle* b, const char* name) {
  for (int i = 0; i < b->nkernels; ++i)
    if (!strcmp(b->kernels[i].name, name)) return i;
  return -1;
}

#include "lcmac_pieces.c"

/* what the index says of a kernel's files */
typedef struct { char manifest[256], lib[256], sha[65]; int64_t bytes; } BFiles;

static int read_index(lcmac_bundle* b, Bctx* c, BFiles* files) {
  const lj_doc* d = c->d;
  char s[256];
  int fi = lj_get(d, 0, "format");
  if (lj_kind(d, 0) != LJ_OBJECT) return bfail(c, "the index is not a JSON object");
  if (fi == -1) return bfail(c, "\"format\" is missing; this lcmac reads %s", LCMAC_BUNDLE_FORMATS);
  if (fi < 0 || lj_str(d, fi, s, sizeof s))
    return bfail(c, "\"format\" is not a string; this lcmac reads %s", LCMAC_BUNDLE_FORMATS);
  b->format = !strcmp(s, LCMAC_BUNDLE_FORMAT) ? 1 : !strcmp(s, "lcmac-bundle/2") ? 2
            : !strcmp(s, "lcmac-bundle/3") ? 3 : 0;
  if (!b->format)
    return bfail(c, "has format \"%s\"; this lcmac reads %s (%s)", s, LCMAC_BUNDLE_FORMATS,
                 strcmp(s, "lcmac-bundle/4") ? "a bundle from a newer lcmac?" : "/4: a CUDA any-shape "
                 "kernel of run-time M, N, K, which Python (lcmac.load) runs; from C, export the "
                 "shapes and ?xNxK rules you need");
  if (bstring(c, 0, "dtype", "the index", s, sizeof s)) return LCMAC_EFORMAT;
  b->dtype = dtype_code(s);
  if (b->dtype < 0) return bfail(c, "unknown dtype \"%s\"", s);
  int t = bfield(c, 0, "target", "the index", LJ_OBJECT);
  if (t < 0) return LCMAC_EFORMAT;
  char family[32] = "";
  int fam = lj_get(d, t, "family");
  if (fam >= 0 && !lj_str(d, fam, family, sizeof family)) {
    if (b->device >= 0 && strcmp(family, "cuda"))
      return btarget(c, "the bundle is %s code, not CUDA code: open it with lcmac_open_bundle",
                     family_name(family));
    if (b->device < 0 && !strcmp(family, "cuda"))
      return btarget(c, "the bundle is CUDA code: open it with lcmac_open_cuda_bundle and a "
                     "device");
  }

  /* kernels */
  int ka = bfield(c, 0, "kernels", "the index", LJ_ARRAY);
  if (ka < 0) return LCMAC_EFORMAT;
  if (d->nodes[ka].count < 1 || d->nodes[ka].count > LCMAC_BUNDLE_MAX_KERNELS)
    return bfail(c, "\"kernels\" must list 1 to %d kernels", LCMAC_BUNDLE_MAX_KERNELS);
  for (int i = 0; i < d->nodes[ka].count; ++i) {
    int k = lj_at(d, ka, i);
    char where[64];
    snprintf(where, sizeof where, "kernels[%d]", i);
    if (lj_kind(d, k) != LJ_OBJECT) return bfail(c, "%s is not an object", where);
    BKernel* kk = &b->kernels[b->nkernels];
    if (bstring(c, k, "name", where, kk->name, sizeof kk->name)) return LCMAC_EFORMAT;
    if (find_kernel(b, kk->name) >= 0) return bfail(c, "kernel %s is listed twice", kk->name);
    int pf = lj_get(d, k, "piece");
    kk->piece = pf >= 0 && lj_kind(d, pf) == LJ_BOOL && d->src[d->nodes[pf].start] == 't';
    int sh = bfield(c, k, "shape", kk->name, LJ_OBJECT);
    if (sh < 0) return LCMAC_EFORMAT;
    const char* dims[3] = {"M", "N", "K"};
    int64_t* out[3] = {&kk->M, &kk->N, &kk->K};
    for (int j = 0; j < 3; ++j) {
      int n = bfield(c, sh, dims[j], kk->name, LJ_NUMBER);
      char what[300];
      snprintf(what, sizeof what, "%s: shape.%s", kk->name, dims[j]);
      if (n < 0 || bint(c, n, what, out[j])) return LCMAC_EFORMAT;
    }
    int n = b->nkernels;
    BFiles* fl = &files[n];
    if (bstring(c, k, "manifest", kk->name, fl->manifest, sizeof fl->manifest) ||
        bstring(c, k, "library", kk->name, fl->lib, sizeof fl->lib) ||
        bstring(c, k, "sha256", kk->name, fl->sha, sizeof fl->sha))
      return LCMAC_EFORMAT;
    for (const char* f[2] = {fl->manifest, fl->lib}, **p = f; p < f + 2; ++p)
      if (!**p || strchr(*p, '/') || !strcmp(*p, ".") || !strcmp(*p, ".."))
        return bfail(c, "kernel %s: \"%s\" is not a file name in the bundle's directory",
                     kk->name, *p);
    int bn = bfield(c, k, "bytes", kk->name, LJ_NUMBER);
    char what[300];
    snprintf(what, sizeof what, "%s: bytes", kk->name);
    if (bn < 0 || bint(c, bn, what, &fl->bytes)) return LCMAC_EFORMAT;
    b->nkernels++;
  }

  /* rules: exact first, then rows, then any (the index's order within each kind) */
  int ra = bfield(c, 0, "rules", "the index", LJ_ARRAY);
  if (ra < 0) return LCMAC_EFORMAT;
  if (d->nodes[ra].count < 1 || d->nodes[ra].count > LCMAC_BUNDLE_MAX_RULES)
    return bfail(c, "\"rules\" must list 1 to %d rules", LCMAC_BUNDLE_MAX_RULES);
  for (int pass = BR_EXACT; pass <= BR_ANY; ++pass)
    for (int i = 0; i < d->nodes[ra].count; ++i) {
      int r = lj_at(d, ra, i);
      char where[160];
      snprintf(where, sizeof where, "rules[%d]", i);
      if (lj_kind(d, r) != LJ_OBJECT) return bfail(c, "%s is not an object", where);
      BRule br;
      memset(&br, 0, sizeof br);
      if (bstring(c, r, "rule", where, br.text, sizeof br.text)) return LCMAC_EFORMAT;
      if (parse_rule_text(br.text, &br))
        return bfail(c, "%s: rule \"%s\" is none of exact:MxNxK, rows:?xNxK, any:?x?x?", where,
                     br.text);
      if (br.kind != pass) continue;
      snprintf(where, sizeof where, "rule %s", br.text);
      if (br.kind == BR_ANY && b->device >= 0)
        return btarget(c, "%s: any-shape rules of CUDA bundles are served by Python (lcmac.load), "
                       "which sums the tiles on the device; from C, export the shapes and ?xNxK "
                       "rules you need (lcmac export)", where);
      int ks = bfield(c, r, "kernels", where, LJ_ARRAY);
      if (ks < 0) return LCMAC_EFORMAT;
      int nk = d->nodes[ks].count;
      int idx[LCMAC_BUNDLE_MAX_KERNELS];
      if (nk < 1) return bfail(c, "%s lists no kernels", where);
      if (nk > LCMAC_BUNDLE_MAX_KERNELS) return bfail(c, "%s lists too many kernels", where);
      for (int j = 0; j < nk; ++j) {
        char name[201];
        if (lj_str(d, lj_at(d, ks, j), name, sizeof name))
          return bfail(c, "%s: kernels[%d] is not a kernel name", where, j);
        idx[j] = find_kernel(b, name);
        if (idx[j] < 0) return bfail(c, "%s names kernel %s, which is not in the bundle", where, name);
      }
      int pn = br.kind == BR_ANY ? lj_get(d, r, "pieces") : -1;
      if (pn == -2 || (pn >= 0 && lj_kind(d, pn) != LJ_NULL)) {   /* twice: read_pieces says so */
        if (read_pieces(b, c, r, &br, idx, nk, where)) return LCMAC_EFORMAT;
        b->rules[b->nrules++] = br;
        continue;
      }
      if (br.kind != BR_EXACT) {
        int rw = bfield(c, r, "rows", where, LJ_ARRAY);
        if (rw < 0) return LCMAC_EFORMAT;
        br.nrows = d->nodes[rw].count;
        if (br.nrows < 1 || br.nrows > LCMAC_BUNDLE_MAX_ROWS)
          return bfail(c, "%s: \"rows\" must list 1 to %d buckets", where, LCMAC_BUNDLE_MAX_ROWS);
        for (int j = 0; j < br.nrows; ++j) {
          char what[200];
          snprintf(what, sizeof what, "%s: rows[%d]", where, j);
          if (bint(c, lj_at(d, rw, j), what, &br.rows[j])) return LCMAC_EFORMAT;
          if (j && br.rows[j] >= br.rows[j - 1])
            return bfail(c, "%s: \"rows\" is not strictly descending", where);
        }
      }
      if (br.kind == BR_ANY) {
        int t = bfield(c, r, "tile", where, LJ_ARRAY);
        if (t < 0) return LCMAC_EFORMAT;
        if (d->nodes[t].count != 2) return bfail(c, "%s: \"tile\" is not [T_N, T_K]", where);
        char w1[200], w2[200];
        snprintf(w1, sizeof w1, "%s: tile[0]", where);
        snprintf(w2, sizeof w2, "%s: tile[1]", where);
        if (bint(c, lj_at(d, t, 0), w1, &br.tn) || bint(c, lj_at(d, t, 1), w2, &br.tk))
          return LCMAC_EFORMAT;
      }
      /* the kernel of every bucket shape among the rule's kernels */
      int nb = br.kind == BR_EXACT ? 1 : br.nrows;
      for (int j = 0; j < nb; ++j) {
        int64_t m = br.kind == BR_EXACT ? br.M : br.rows[j];
        int64_t n = br.kind == BR_ANY ? br.tn : br.N, k = br.kind == BR_ANY ? br.tk : br.K;
        br.bucket[j] = -1;
        for (int q = 0; q < nk && br.bucket[j] < 0; ++q) {
          const BKernel* kk = &b->kernels[idx[q]];
          if (kk->M == m && kk->N == n && kk->K == k) br.bucket[j] = idx[q];
        }
        if (br.bucket[j] < 0)
          return bfail(c, "%s lists no %lldx%lldx%lld kernel", where, (long long)m,
                       (long long)n, (long long)k);
      }
      b->rules[b->nrules++] = br;
    }
  return LCMAC_OK;
}

static int cuda_bundle_workspace(lcmac_bundle* b, char* err, size_t errlen, const char* who);

/* lcmac_open_bundle (device -1) and lcmac_open_cuda_bundle (device >= 0) */
static lcmac_bundle* open_bundle(const char* who, const char* dir, int device, int num_threads,
                                 int* status, char* err, size_t errlen) {
  int rc = LCMAC_OK;
  char* text = NULL;
  size_t n = 0;
  lj_doc d;
  memset(&d, 0, sizeof d);
  char path[PATH_MAX];
  lcmac_bundle* b = NULL;
  BFiles* files = NULL;   /* per kernel, from the index */
  if (err && errlen) err[0] = 0;
  if (!dir || !*dir) {
    put_err(err, errlen, "%s: the directory must not be NULL or empty", who);
    rc = LCMAC_EINVAL;
    goto out;
  }
  if (strlen(dir) + sizeof LCMAC_BUNDLE_INDEX + 1 > sizeof path) {
    put_err(err, errlen, "%s: path too long: %s", who, dir);
    rc = LCMAC_EINVAL;
    goto out;
  }
  snprintf(path, sizeof path, "%s/%s", dir, LCMAC_BUNDLE_INDEX);
  int e = read_file(path, LCMAC_BUNDLE_MAX_INDEX, &text, &n);
  if (e) {
    put_err(err, errlen, "%s: cannot read the bundle index %s: %s", who, path,
            e == EFBIG ? "larger than 4 MiB" : strerror(e));
    rc = e == EFBIG ? LCMAC_EFORMAT : LCMAC_EIO;
    goto out;
  }
  Bctx c = {&d, who, path, err, errlen};
  if (lj_parse(&d, text, n)) {
    put_err(err, errlen, "%s: %s: %s", who, path, d.err);
    rc = LCMAC_EFORMAT;
    goto out;
  }
  if (!(files = (BFiles*)calloc(LCMAC_BUNDLE_MAX_KERNELS, sizeof *files)) ||
      !(b = (lcmac_bundle*)calloc(1, sizeof *b))) {
    put_err(err, errlen, "%s: out of memory", who);
    rc = LCMAC_ELOAD;
    goto out;
  }
  snprintf(b->dir, sizeof b->dir, "%s", dir);
  b->device = device;
  pthread_mutex_init(&b->mu, NULL);
  if ((rc = read_index(b, &c, files))) goto out;
  /* every kernel opened through its manifest (which checks the library: size, SHA-256, ELF),
     then the manifest's record of the library compared with the index's: one hash per file */
  for (int i = 0; i < b->nkernels; ++i) {
    BKernel* k = &b->kernels[i];
    char man[PATH_MAX], msg[LCMAC_ERRLEN];
    snprintf(man, sizeof man, "%s/%s", dir, files[i].manifest);
    msg[0] = 0;
    k->h = device >= 0 ? lcmac_open_cuda_artifact(man, device, &rc, msg, sizeof msg)
                       : lcmac_open_artifact(man, num_threads, &rc, msg, sizeof msg);
    if (!k->h) {
      put_err(err, errlen, "%s: kernel %s of the bundle %s: %s", who, k->name, dir, msg);
      goto out;
    }
    if (strcmp(k->h->sha256, files[i].sha) || (k->h->bytes >= 0 && k->h->bytes != files[i].bytes)) {
      put_err(err, errlen, "%s: kernel %s of the bundle %s: its manifest records another library "
              "(SHA-256 %.12s…, %lld bytes) than the bundle index (SHA-256 %.12s…, %lld bytes): the "
              "bundle was altered; export it again", who, k->name, dir, k->h->sha256,
              (long long)k->h->bytes, files[i].sha, (long long)files[i].bytes);
      rc = LCMAC_ECORRUPT;
      goto out;
    }
    int64_t M, N, K;
    lcmac_shape(k->h, &M, &N, &K);
    if (M != k->M || N != k->N || K != k->K || lcmac_dtype_of(k->h) != b->dtype) {
      put_err(err, errlen, "%s: kernel %s of the bundle %s: its manifest says %lldx%lldx%lld %s, "
              "the index %lldx%lldx%lld %s", who, k->name, dir, (long long)M, (long long)N,
              (long long)K, dtype_name(lcmac_dtype_of(k->h)), (long long)k->M, (long long)k->N,
              (long long)k->K, dtype_name(b->dtype));
      rc = LCMAC_EFORMAT;
      goto out;
    }
  }
  if ((rc = pieces_open(b, err, errlen, who))) goto out;
  if (device >= 0) rc = cuda_bundle_workspace(b, err, errlen, who);
out:
  free(files);
  free(text);
  lj_free(&d);
  if (rc && b) {
    lcmac_bundle_close(b);
    b = NULL;
  }
  if (status) *status = rc;
  return b;
}

lcmac_bundle* lcmac_open_bundle(const char* dir, int num_threads, int* status, char* err,
                                size_t errlen) {
  return open_bundle("lcmac_open_bundle", dir, -1, num_threads, status, err, errlen);
}

lcmac_bundle* lcmac_open_cuda_bundle(const char* dir, int device, int* status, char* err,
                                     size_t errlen) {
  if (device < 0) {   /* open_bundle reads a negative device as "CPU" */
    put_err(err, errlen, "lcmac_open_cuda_bundle: device %d is not a device ordinal", device);
    if (status) *status = LCMAC_EINVAL;
    return NULL;
  }
  return open_bundle("lcmac_open_cuda_bundle", dir, device, 0, status, err, errlen);
}

/* ---- running ---- */

static void* bundle_scratch(lcmac_bundle* b, size_t bytes) {
  if (bytes > b->scratch_bytes) {
    free(b->scratch);
    b->scratch_bytes = 0;
    b->scratch = raw_alloc(bytes);
    if (b->scratch) b->scratch_bytes = bytes;
  }
  return b->scratch;
}

static int bundle_call(lcmac_bundle* b, int kernel, const void* A, const void* B, void* C) {
  BKernel* k = &b->kernels[kernel];
  int rc = lcmac_matmul(k->h, A, B, C, k->M, k->N, k->K, b->dtype);
  if (rc)
    put_err(b->err, sizeof b->err, "lcmac_bundle_matmul: kernel %s: %s", k->name,
             lcmac_last_error(k->h));
  return rc;
}

static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t f32_to_bf16(float f) {   /* round to nearest even; NaN stays NaN */
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static int run_rows(lcmac_bundle* b, const BRule* r, const char* A, const void* B, char* C,
                    int64_t M, int64_t N, int64_t K, size_t sz) {
  int64_t start = 0;
  int rc;
  for (int j = 0; j < r->nrows; ++j)
    for (int64_t P = r->rows[j]; M - start >= P; start += P)
      if ((rc = bundle_call(b, r->bucket[j], A + (size_t)start * K * sz, B,
                            C + (size_t)start * N * sz)))
        return rc;
  if (start == M) return LCMAC_OK;
  int64_t P = r->rows[r->nrows - 1], rows = M - start;
  size_t na = (size_t)P * K * sz, nc = (size_t)P * N * sz;
  char* s = (char*)bundle_scratch(b, na + nc);
  if (!s) {
    put_err(b->err, sizeof b->err, "lcmac_bundle_matmul: out of memory for a %lldx%lld padding "
             "buffer", (long long)P, (long long)K);
    return LCMAC_EKERNEL;
  }
  memset(s, 0, na);
  memcpy(s, A + (size_t)start * K * sz, (size_t)rows * K * sz);
  if ((rc = bundle_call(b, r->bucket[r->nrows - 1], s, B, s + na))) return rc;
  memcpy(C + (size_t)start * N * sz, s + na, (size_t)rows * N * sz);
  return LCMAC_OK;
}

static int run_any(lcmac_bundle* b, const BRule* r, const char* A, const char* B, char* C,
                   int64_t M, int64_t N, int64_t K, size_t sz) {
  int64_t tn = r->tn, tk = r->tk, pmax = r->rows[0];
  int dt = b->dtype;
  int wide = K > tk && sz == 2;
  if (wide && dt != LCMAC_BFLOAT16) {
    put_err(b->err, sizeof b->err, "lcmac_bundle_matmul: the any-shape rule in C accumulates "
             "16-bit products only for bfloat16 (this bundle is %s)", dtype_name(dt));
    return LCMAC_EINVAL;
  }
  size_t nb = (size_t)tk * tn * sz, na = (size_t)pmax * tk * sz, nc = (size_t)pmax * tn * sz;
  size_t nacc = wide ? (size_t)M * N * sizeof(float) : 0;
  char* s = (char*)bundle_scratch(b, nb + na + nc + nacc);
  if (!s) {
    put_err(b->err, sizeof b->err, "lcmac_bundle_matmul: out of memory for the tile buffers");
    return LCMAC_EKERNEL;
  }
  char *bbuf = s, *abuf = s + nb, *cbuf = s + nb + na;
  float* acc = wide ? (float*)(s + nb + na + nc) : NULL;
  int rc;
  for (int64_t n0 = 0; n0 < N; n0 += tn) {
    int64_t nw = N - n0 < tn ? N - n0 : tn;
    for (int64_t k0 = 0; k0 < K; k0 += tk) {
      int64_t kw = K - k0 < tk ? K - k0 : tk;
      int first = k0 == 0;
      if (kw < tk || nw < tn) memset(bbuf, 0, nb);
      for (int64_t i = 0; i < kw; ++i)
        memcpy(bbuf + (size_t)i * tn * sz, B + ((size_t)(k0 + i) * N + n0) * sz, (size_t)nw * sz);
      /* the row pieces: greedy over the ladder, the remainder padded to the smallest bucket */
      int64_t start = 0;
      int j = 0;
      while (start < M) {
        while (j < r->nrows - 1 && M - start < r->rows[j]) ++j;
        int64_t P = r->rows[j], rows = M - start < P ? M - start : P;
        if (rows < P || kw < tk) memset(abuf, 0, (size_t)P * tk * sz);
        for (int64_t i = 0; i < rows; ++i)
          memcpy(abuf + (size_t)i * tk * sz, A + ((size_t)(start + i) * K + k0) * sz, (size_t)kw * sz);
        if ((rc = bundle_call(b, r->bucket[j], abuf, bbuf, cbuf))) return rc;
        for (int64_t i = 0; i < rows; ++i) {
          const char* src = cbuf + (size_t)i * tn * sz;
          size_t row = (size_t)(start + i) * N + n0;
          if (wide) {
            float* dst = acc + row;
            const uint16_t* p = (const uint16_t*)src;
            for (int64_t q = 0; q < nw; ++q) dst[q] = first ? bf16_to_f32(p[q]) : dst[q] + bf16_to_f32(p[q]);
          } else if (first) {
            memcpy(C + row * sz, src, (size_t)nw * sz);
          } else if (dt == LCMAC_FLOAT64) {
            double* dst = (double*)(C + row * sz);
            for (int64_t q = 0; q < nw; ++q) dst[q] += ((const double*)src)[q];
          } else {
            float* dst = (float*)(C + row * sz);
            for (int64_t q = 0; q < nw; ++q) dst[q] += ((const float*)src)[q];
          }
        }
        start += rows;
      }
    }
  }
  if (wide)
    for (size_t i = 0; i < (size_t)M * N; ++i) ((uint16_t*)C)[i] = f32_to_bf16(acc[i]);
  return LCMAC_OK;
}

static int rule_admits(const BRule* r, int64_t M, int64_t N, int64_t K) {
  return r->kind == BR_ANY || (r->kind == BR_ROWS && r->N == N && r->K == K) ||
         (r->kind == BR_EXACT && r->M == M && r->N == N && r->K == K);
}

int lcmac_bundle_rule_for(const lcmac_bundle* b, int64_t M, int64_t N, int64_t K) {
  if (!b) return -1;
  for (int i = 0; i < b->nrules; ++i)
    if (rule_admits(&b->rules[i], M, N, K)) return i;
  return -1;
}

/* The arguments of a bundle call checked (CPU or CUDA as the entry point `who` is): LCMAC_OK
 * with the rule that admits the shape in *ri, or LCMAC_EINVAL with the message in b->err. */
static int bundle_args(lcmac_bundle* b, const char* who, int cuda, const void* A, const void* B,
                       const void* C, int64_t M, int64_t N, int64_t K, int dtype, int* ri) {
  DLDataType dt;
  if (!A || !B || !C) {
    put_err(b->err, sizeof b->err, "%s: %s is NULL", who, !A ? "A" : !B ? "B" : "C");
  } else if (M < 1 || N < 1 || K < 1 || M > INT32_MAX || N > INT32_MAX || K > INT32_MAX) {
    put_err(b->err, sizeof b->err, "%s: M, N, K must be positive and below 2^31 (got %lld, "
             "%lld, %lld)", who, (long long)M, (long long)N, (long long)K);
  } else if (dtype_of(dtype, &dt)) {
    put_err(b->err, sizeof b->err, "%s: unknown dtype code %d (see lcmac_dtype)", who, dtype);
  } else if (cuda != (b->device >= 0)) {
    put_err(b->err, sizeof b->err, cuda ? "%s: this is a CPU bundle; call lcmac_bundle_matmul"
             : "%s: this is a CUDA bundle; call lcmac_bundle_cuda_matmul with device pointers "
             "and a stream", who);
  } else if (dtype != b->dtype) {
    put_err(b->err, sizeof b->err, "%s: dtype %s is not the bundle's %s", who,
             dtype_name(dtype), dtype_name(b->dtype));
  } else if ((*ri = lcmac_bundle_rule_for(b, M, N, K)) < 0) {
    size_t len = (size_t)snprintf(b->err, sizeof b->err, "%s: no rule of the bundle %s admits "
                                  "%lldx%lldx%lld; it serves", who, b->dir, (long long)M,
                                  (long long)N, (long long)K);
    for (int i = 0; i < b->nrules && len < sizeof b->err; ++i)
      len += (size_t)snprintf(b->err + len, sizeof b->err - len, "%s %s", i ? "," : "",
                              b->rules[i].text);
  } else {
    return LCMAC_OK;
  }
  return LCMAC_EINVAL;
}

int lcmac_bundle_matmul(lcmac_bundle* b, const void* A, const void* B, void* C, int64_t M,
                        int64_t N, int64_t K, int dtype) {
  static const char who[] = "lcmac_bundle_matmul";
  if (!b) {
    snprintf(tls_null_error, sizeof tls_null_error, "%s: the bundle is NULL", who);
    return LCMAC_EINVAL;
  }
  pthread_mutex_lock(&b->mu);
  int ri = -1;
  int rc = bundle_args(b, who, 0, A, B, C, M, N, K, dtype, &ri);
  if (rc == LCMAC_OK) {
    rc = LCMAC_EINVAL;
    size_t sz = dtype_bytes(dtype);
    size_t na = (size_t)M * K * sz, nb = (size_t)K * N * sz, nc = (size_t)M * N * sz;
    const BRule* r = &b->rules[ri];
    if (overlaps(C, nc, A, na) || overlaps(C, nc, B, nb)) {
      put_err(b->err, sizeof b->err, "lcmac_bundle_matmul: C overlaps %s in memory",
               overlaps(C, nc, A, na) ? "A" : "B");
    } else if (r->kind == BR_EXACT) {
      rc = bundle_call(b, r->bucket[0], A, B, C);
    } else if (r->kind == BR_ROWS) {
      rc = run_rows(b, r, (const char*)A, B, (char*)C, M, N, K, sz);
    } else if (r->pieces) {
      rc = run_pieces(b, r, (const char*)A, (const char*)B, (char*)C, M, N, K, sz);
    } else {
      rc = run_any(b, r, (const char*)A, (const char*)B, (char*)C, M, N, K, sz);
    }
  }
  if (rc == LCMAC_OK) b->err[0] = 0;
  pthread_mutex_unlock(&b->mu);
  return rc;
}

/* ---- queries ---- */

const char* lcmac_bundle_last_error(const lcmac_bundle* b) {
  return b ? b->err : tls_null_error;
}

int lcmac_bundle_dtype(const lcmac_bundle* b) {
  return b ? b->dtype : -1;
}

int lcmac_bundle_num_rules(const lcmac_bundle* b) {
  return b ? b->nrules : 0;
}

const char* lcmac_bundle_rule(const lcmac_bundle* b, int i) {
  return b && i >= 0 && i < b->nrules ? b->rules[i].text : NULL;
}

int lcmac_bundle_num_kernels(const lcmac_bundle* b) {
  return b ? b->nkernels : 0;
}

int lcmac_bundle_num_threads(const lcmac_bundle* b) {
  return b && b->nkernels ? lcmac_num_threads(b->kernels[0].h) : 0;
}

void lcmac_bundle_close(lcmac_bundle* b) {
  if (!b) return;
  if (b->d_ws) {   /* allocated on the first kernel's device (all share it) */
    lcmac_handle* h = b->kernels[0].h;
    if (cu.CtxPush((CUcontext_t)h->cu_ctx) == CU_SUCCESS) {
      cu.MemFree(b->d_ws);
      cu_leave();
    }
  }
  for (int i = 0; i < b->nkernels; ++i) lcmac_close(b->kernels[i].h);
  free(b->scratch);
  if (b->blas) dlclose(b->blas);
  pthread_mutex_destroy(&b->mu);
  free(b);
}

#include "lcmac_bundle_cuda.c"
