/*
 * lcmac_check.c — what the open functions (lcmac_c.c, lcmac_cuda.c) check before they load an artifact,
 * so that a damaged or foreign file is an error with a message instead of a crash in the
 * dynamic loader: the manifest (read with the strict JSON reader of lcmac_json.c), the target
 * it names against this machine and CPU, and the library file (size, SHA-256, ELF headers).
 * #included by lcmac_c.c (everything here is static but lcmac_sha256_hex).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__aarch64__)
#include <sys/auxv.h>
#include <sys/prctl.h>
#endif
#if defined(__x86_64__)
#include <sys/syscall.h>
#endif

#include "../include/lcmac.h"
#include "lcmac_json.c"

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

/* a message into err (where the caller gave one) */
static void put_err(char* err, size_t errlen, const char* fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* ---- SHA-256 (FIPS 180-4): a manifest records its library's digest ---- */
typedef struct { uint32_t h[8]; uint64_t bytes; unsigned char block[64]; size_t used; } Sha256;

/* the first 32 bits of the fractional parts of the cube roots of the first 64 primes */
static const uint32_t SHA256_K[64] = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROR32(x, n) ((x) >> (n) | (x) << (32 - (n)))

static void sha256_init(Sha256* s) {
  /* the first 32 bits of the fractional parts of the square roots of the first 8 primes */
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, h0, sizeof h0);
  s->bytes = 0;
  s->used = 0;
}

static void sha256_block(uint32_t h[8], const unsigned char* p) {
  uint32_t w[64];
  for (int t = 0; t < 16; ++t)
    w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 |
           (uint32_t)p[4 * t + 3];
  for (int t = 16; t < 64; ++t) {
    uint32_t s0 = ROR32(w[t - 15], 7) ^ ROR32(w[t - 15], 18) ^ (w[t - 15] >> 3);
    uint32_t s1 = ROR32(w[t - 2], 17) ^ ROR32(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int t = 0; t < 64; ++t) {
    uint32_t t1 = k + (ROR32(e, 6) ^ ROR32(e, 11) ^ ROR32(e, 25)) + ((e & f) ^ (~e & g)) +
                  SHA256_K[t] + w[t];
    uint32_t t2 = (ROR32(a, 2) ^ ROR32(a, 13) ^ ROR32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
  }
  h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

static void sha256_update(Sha256* s, const unsigned char* p, size_t n) {
  s->bytes += n;
  if (s->used) {
    size_t k = 64 - s->used < n ? 64 - s->used : n;
    memcpy(s->block + s->used, p, k);
    s->used += k;
    p += k;
    n -= k;
    if (s->used < 64) return;
    sha256_block(s->h, s->block);
    s->used = 0;
  }
  for (; n >= 64; p += 64, n -= 64) sha256_block(s->h, p);
  if (n) memcpy(s->block, p, n);
  s->used = n;
}

static void sha256_final_hex(Sha256* s, char hex[65]) {
  static const unsigned char pad[64] = {0x80};
  uint64_t bits = s->bytes * 8;
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = (unsigned char)(bits >> (56 - 8 * i));
  sha256_update(s, pad, s->used < 56 ? 56 - s->used : 120 - s->used);   /* to 56 mod 64 */
  sha256_update(s, len, 8);
  for (int i = 0; i < 8; ++i) snprintf(hex + 8 * i, 9, "%08x", (unsigned)s->h[i]);
}

int lcmac_sha256_hex(const void* data, size_t n, char hex[65]) {
  if (!hex || (!data && n)) return LCMAC_EINVAL;
  Sha256 s;
  sha256_init(&s);
  if (n) sha256_update(&s, (const unsigned char*)data, n);
  sha256_final_hex(&s, hex);
  return LCMAC_OK;
}

/* ---- checks of a library file, made before dlopen ---- */
#if defined(__x86_64__)
#define LCMAC_HOST_EM 62
#define LCMAC_HOST_FAMILY "x86"
#elif defined(__aarch64__)
#define LCMAC_HOST_EM 183
#define LCMAC_HOST_FAMILY "aarch64"
#else
#define LCMAC_HOST_EM 0
#define LCMAC_HOST_FAMILY "other"
#endif

static const char* machine_name(unsigned em) {
  switch (em) {
    case 3: return "32-bit x86";
    case 40: return "32-bit ARM";
    case 62: return "x86-64";
    case 183: return "AArch64";
    case 243: return "RISC-V";
    default: return "neither x86-64 nor AArch64";
  }
}

static const char* family_name(const char* family) {
  return !strcmp(family, "x86") ? "x86-64" : !strcmp(family, "aarch64") ? "AArch64"
       : !strcmp(family, "cuda") ? "CUDA (GPU)" : family;
}

/* n bytes at offset off, or -1 (a short read counts as an error) */
static int read_at(int fd, void* buf, size_t n, uint64_t off) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, (char*)buf + got, n - got, (off_t)(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

static uint64_t le_bytes(const unsigned char* p, int n) {   /* ELF fields, little-endian */
  uint64_t v = 0;
  while (n-- > 0) v = v << 8 | p[n];
  return v;
}

/* The file is a 64-bit little-endian ELF shared object for this machine whose program headers
 * (what the dynamic loader maps) lie inside it: a segment past the end of a truncated file
 * would still be mapped, and the first touch of it would kill the process with SIGBUS. */
static int check_elf(int fd, uint64_t size, const char* who, const char* path, char* err,
                     size_t errlen) {
  unsigned char eh[64];
  if (size < sizeof eh || read_at(fd, eh, sizeof eh, 0)) {
    put_err(err, errlen, "%s: %s is too short (%llu bytes) to be a shared library: truncated?",
            who, path, (unsigned long long)size);
    return LCMAC_ECORRUPT;
  }
  const char* bad = memcmp(eh, "\177ELF", 4) ? "is not an ELF file"
                  : eh[4] != 2 ? "is not 64-bit ELF" : eh[5] != 1 ? "is not little-endian ELF"
                  : eh[6] != 1 ? "has an unknown ELF version"
                  : le_bytes(eh + 16, 2) != 3 ? "is not a shared library (ELF type is not ET_DYN)"
                  : NULL;
  if (bad) {
    put_err(err, errlen, "%s: %s %s", who, path, bad);
    return LCMAC_ECORRUPT;
  }
  unsigned em = (unsigned)le_bytes(eh + 18, 2);
  if (em != LCMAC_HOST_EM) {
    put_err(err, errlen, "%s: %s is %s code and this machine is %s", who, path, machine_name(em),
            machine_name(LCMAC_HOST_EM));
    return LCMAC_ETARGET;
  }
  uint64_t phoff = le_bytes(eh + 32, 8), shoff = le_bytes(eh + 40, 8);
  unsigned phsize = (unsigned)le_bytes(eh + 54, 2), phnum = (unsigned)le_bytes(eh + 56, 2);
  unsigned shsize = (unsigned)le_bytes(eh + 58, 2), shnum = (unsigned)le_bytes(eh + 60, 2);
  if (phsize != 56 || phnum == 0 || phnum == 0xFFFF || phoff > size || phnum * 56ull > size - phoff ||
      (shnum && (shsize != 64 || shoff > size || shnum * 64ull > size - shoff))) {
    put_err(err, errlen, "%s: %s has ELF headers that are malformed or lie past the end of the "
            "file (%llu bytes): truncated or damaged", who, path, (unsigned long long)size);
    return LCMAC_ECORRUPT;
  }
  unsigned char* ph = (unsigned char*)malloc(phnum * 56u);
  if (!ph || read_at(fd, ph, phnum * 56u, phoff)) {
    free(ph);
    put_err(err, errlen, "%s: cannot read the ELF program headers of %s", who, path);
    return LCMAC_EIO;
  }
  int rc = LCMAC_OK;
  for (unsigned i = 0; i < phnum && rc == LCMAC_OK; ++i) {
    const unsigned char* p = ph + 56u * i;
    uint64_t off = le_bytes(p + 8, 8), filesz = le_bytes(p + 32, 8), memsz = le_bytes(p + 40, 8);
    if (off > size || filesz > size - off) {
      put_err(err, errlen, "%s: %s: ELF segment %u (file bytes %llu to %llu) lies past the end of "
              "the file (%llu bytes): truncated", who, path, i, (unsigned long long)off,
              (unsigned long long)off + filesz, (unsigned long long)size);
      rc = LCMAC_ECORRUPT;
    } else if (le_bytes(p, 4) == 1 && filesz > memsz) {   /* PT_LOAD */
      put_err(err, errlen, "%s: %s: ELF segment %u is malformed", who, path, i);
      rc = LCMAC_ECORRUPT;
    }
  }
  free(ph);
  return rc;
}

/* SHA-256 of the whole file as hex: 0, or -1 on a read error */
static int sha256_fd(int fd, char hex[65]) {
  enum { CHUNK = 1 << 18 };
  unsigned char* buf = (unsigned char*)malloc(CHUNK);
  if (!buf) return -1;
  Sha256 s;
  sha256_init(&s);
  uint64_t off = 0;
  for (;;) {
    ssize_t r = pread(fd, buf, CHUNK, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      free(buf);
      errno = e;
      return -1;
    }
    if (r == 0) break;
    sha256_update(&s, buf, (size_t)r);
    off += (uint64_t)r;
  }
  free(buf);
  sha256_final_hex(&s, hex);
  return 0;
}

/* The checks of the library file: it opens, is a regular file, has want_bytes bytes and the
 * digest want_sha (where given: -1 / NULL when there is no manifest), and passes check_elf. */
static int check_library_file(const char* who, const char* path, int64_t want_bytes,
                              const char* want_sha, char* err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  const char* why = fd < 0 || fstat(fd, &st) ? strerror(errno)
                  : !S_ISREG(st.st_mode) ? "not a regular file" : NULL;
  if (why) {
    put_err(err, errlen, "%s: cannot load %s: %s", who, path, why);
    if (fd >= 0) close(fd);
    return LCMAC_EIO;
  }
  uint64_t size = (uint64_t)st.st_size;
  int rc = LCMAC_OK;
  char hex[65];
  if (want_bytes >= 0 && size != (uint64_t)want_bytes) {
    put_err(err, errlen, "%s: %s has %llu bytes and its manifest records %lld: truncated or "
            "replaced; rebuild the artifact", who, path, (unsigned long long)size,
            (long long)want_bytes);
    rc = LCMAC_ECORRUPT;
  } else if (want_sha && sha256_fd(fd, hex)) {
    put_err(err, errlen, "%s: cannot read %s: %s", who, path, strerror(errno));
    rc = LCMAC_EIO;
  } else if (want_sha && strcmp(hex, want_sha)) {
    put_err(err, errlen, "%s: %s does not match the SHA-256 its manifest records (damaged, "
            "tampered with, or rebuilt without its manifest); rebuild the artifact", who, path);
    rc = LCMAC_ECORRUPT;
  } else {
    rc = check_elf(fd, size, who, path, err, errlen);
  }
  close(fd);
  return rc;
}

/* ---- the manifest (<name>.json) and the target it names ---- */
#define LCMAC_FORMAT "lcmac-artifact/1"
#define LCMAC_MANIFEST_MAX (1 << 20)   /* a manifest is a few KB */

typedef struct {
  int cuda;                 /* in: a CUDA artifact is wanted (lcmac_open_cuda_artifact) */
  char entry[201], lib[PATH_MAX], sha256[65];
  int64_t M, N, K, bytes;   /* bytes: -1 when not recorded */
  int dtype;
  char arch[16];            /* CUDA: the compute arch, e.g. "sm_90a" */
  int64_t ws_bytes;         /* CUDA: extra.workspace_bytes, -1 when not recorded */
  int64_t prep_bytes;       /* CPU: bytes of B prepared once (extra.prepared_b), -1 when none */
  int64_t prep_shape[2];    /* its shape and element type (DLPack code and bits) */
  int prep_code, prep_bits;
  int piece;                /* CPU: entry_points[0].kind "matmul_piece" (a bundle's piece kernel) */
  int64_t piece_units[2];   /* its run-time rows and depth: multiples of these (extra.piece);
                               0 where fixed at the shape's M and K */
} ArtifactInfo;

typedef struct { const lj_doc* d; const char* who; const char* path; char* err; size_t errlen; } Mctx;

static int mfail(Mctx* c, int status, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  put_err(c->err, c->errlen, "%s: manifest %s: %s", c->who, c->path, msg);
  return status;
}

/* Member key of object obj, of type want: its node; -1 when absent and optional; -2 (with a
 * message) when absent and required, repeated, or of another type. */
static int mfield(Mctx* c, int obj, const char* key, const char* name, lj_type want, int optional) {
  static const char* kinds[] = {"null", "true or false", "a number", "a string", "an array",
                                "an object"};
  int i = lj_get(c->d, obj, key);
  if (i == -1 && optional) return -1;
  if (i == -1) return mfail(c, -2, "\"%s\" is missing", name);
  if (i == -2) return mfail(c, -2, "\"%s\" occurs twice", name);
  if (lj_kind(c->d, i) != want) return mfail(c, -2, "\"%s\" is not %s", name, kinds[want]);
  return i;
}

static int dtype_code(const char* name) {
  static const char* names[] = {"float32", "float64", "bfloat16", "float16"};   /* lcmac_dtype */
  for (int i = 0; i < 4; ++i)
    if (!strcmp(name, names[i])) return i;
  return -1;
}

static const char* dtype_name(int code) {
  return code == LCMAC_FLOAT32 ? "float32" : code == LCMAC_FLOAT64 ? "float64"
       : code == LCMAC_BFLOAT16 ? "bfloat16" : code == LCMAC_FLOAT16 ? "float16" : "?";
}

/* The whole file into a NUL-terminated buffer (*out, to free): 0, or an errno value
 * (EFBIG above max) */
static int read_file(const char* path, size_t max, char** out, size_t* n) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0) return errno;
  int e = fstat(fd, &st) ? errno : S_ISDIR(st.st_mode) ? EISDIR : !S_ISREG(st.st_mode) ? EINVAL
        : (uint64_t)st.st_size > max ? EFBIG : 0;
  if (e) {
    close(fd);
    return e;
  }
  char* buf = (char*)malloc((size_t)st.st_size + 1);
  e = buf && read_at(fd, buf, (size_t)st.st_size, 0) == 0 ? 0 : buf ? EIO : ENOMEM;
  close(fd);
  if (e) { free(buf); return e; }
  buf[st.st_size] = 0;
  *out = buf;
  *n = (size_t)st.st_size;
  return 0;
}

/* a string member into out: 0, or -1 with a message */
static int mstring(Mctx* c, int obj, const char* key, const char* name, char* out, size_t cap) {
  int i = mfield(c, obj, key, name, LJ_STRING, 0);
  if (i < 0) return -1;
  if (lj_str(c->d, i, out, cap)) return mfail(c, -1, "\"%s\" is too long or holds a NUL", name);
  for (const char* p = out; *p; ++p)   /* these strings go into messages and paths */
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      return mfail(c, -1, "\"%s\" holds a control character", name);
  return 0;
}

/* an integer member of at least min: 0, or -1 with a message */
static int minteger(Mctx* c, int obj, const char* key, const char* name, int64_t min, int64_t* out) {
  int i = mfield(c, obj, key, name, LJ_NUMBER, 0);
  if (i < 0) return -1;
  if (lj_int(c->d, i, out) || *out < min)
    return mfail(c, -1, "\"%s\" is not an integer of at least %lld", name, (long long)min);
  return 0;
}

#if defined(__x86_64__)
/* lcmac/spec/cpu/x86.py REQUIRED_FLAGS, for a manifest whose extra.cpu_flags lacks them */
static const char* const X86_TARGET_FLAGS[][3] = {
  {"x86_64-avx512", "avx512f", NULL}, {"x86_64-avx2", "avx2", "fma"},
};

/* the flags line of /proc/cpuinfo (to free), or NULL when it cannot be read */
static char* cpuinfo_flags(void) {
  FILE* f = fopen("/proc/cpuinfo", "re");
  if (!f) return NULL;
  char *line = NULL, *out = NULL;
  size_t cap = 0;
  while (!out && getline(&line, &cap, f) > 0)
    if (!strncmp(line, "flags", 5) && strchr(line, ':')) out = strdup(strchr(line, ':') + 1);
  free(line);
  fclose(f);
  return out;
}

static int has_word(const char* list, const char* w) {   /* w among list's blank-separated words */
  size_t n = strlen(w);
  for (const char* p = list; *p;) {
    p += strspn(p, " \t\n");
    size_t k = strcspn(p, " \t\n");
    if (k == n && !memcmp(p, w, n)) return 1;
    p += k;
  }
  return 0;
}

static int is_word(const char* s) {   /* non-empty, printable, no blanks */
  for (const char* p = s; *p; ++p)
    if ((unsigned char)*p <= 0x20 || *p == 0x7f) return 0;
  return s[0] != 0;
}

static void note_missing(const char* have, const char* flag, char* missing, size_t cap) {
  size_t len = strlen(missing);
  if (!has_word(have, flag) && !has_word(missing, flag))
    snprintf(missing + len, cap - len, "%s%s", len ? " " : "", flag);
}

/* An AMX kernel (extra.gemm_kernel "amx", lcmac/runtime/amx.py request_amx): Linux hands out
 * AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), else
 * the first tile instruction is an illegal instruction.  The permission is per process. */
static int request_amx(Mctx* c, int extra) {
  char kernel[32];
  int k = extra < 0 ? -1 : mfield(c, extra, "gemm_kernel", "extra.gemm_kernel", LJ_STRING, 1);
  if (k == -2) return LCMAC_EFORMAT;
  if (k < 0 || lj_str(c->d, k, kernel, sizeof kernel) || strcmp(kernel, "amx")) return LCMAC_OK;
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */))
    return mfail(c, LCMAC_ETARGET, "Linux refused this process AMX tile state (arch_prctl "
                 "ARCH_REQ_XCOMP_PERM: %s), which the artifact's AMX kernel needs (Linux 5.16 or "
                 "newer); rebuild it without the amx config knob", strerror(errno));
  return LCMAC_OK;
}

/* Every CPU flag the kernel needs (extra.cpu_flags, and its target's) is in /proc/cpuinfo;
 * without the check a missing one is an illegal instruction mid-call.  With no
 * /proc/cpuinfo nothing can be told and nothing is refused, as in lcmac.load. */
static int check_cpu(Mctx* c, int root, const char* tname) {
  int extra = mfield(c, root, "extra", "extra", LJ_OBJECT, 1);
  int arr = extra < 0 ? extra : mfield(c, extra, "cpu_flags", "extra.cpu_flags", LJ_ARRAY, 1);
  if (arr == -2) return LCMAC_EFORMAT;
  char* have = cpuinfo_flags();
  char missing[512] = "", flag[64];
  int n = arr < 0 ? 0 : c->d->nodes[arr].count, rc = LCMAC_OK;
  for (int i = 0; i < n && rc == LCMAC_OK; ++i) {
    if (lj_str(c->d, lj_at(c->d, arr, i), flag, sizeof flag) || !is_word(flag))
      rc = mfail(c, LCMAC_EFORMAT, "extra.cpu_flags is not a list of CPU flag names");
    else if (have)
      note_missing(have, flag, missing, sizeof missing);
  }
  for (size_t t = 0; have && t < sizeof X86_TARGET_FLAGS / sizeof X86_TARGET_FLAGS[0]; ++t)
    for (int k = 1; k < 3 && !strcmp(tname, X86_TARGET_FLAGS[t][0]) && X86_TARGET_FLAGS[t][k]; ++k)
      note_missing(have, X86_TARGET_FLAGS[t][k], missing, sizeof missing);
  free(have);
  if (rc == LCMAC_OK && missing[0])
    rc = mfail(c, LCMAC_ETARGET, "this CPU lacks the feature flag(s) %s that code built for %s "
               "needs; rebuild the artifact on this machine (lcmac build --target host)",
               missing, tname);
  if (rc == LCMAC_OK) rc = request_amx(c, extra);
  return rc;
}
#elif defined(__aarch64__)
#ifndef HWCAP_SVE
#define HWCAP_SVE (1UL << 22)
#endif
#ifndef PR_SVE_GET_VL
#define PR_SVE_GET_VL 51
#define PR_SVE_VL_LEN_MASK 0xffff
#endif
/* As lcmac/targets/aarch64.py check_runnable: SVE code needs SVE, and a fixed-length SVE
 * target at least its vector length (shorter vectors compute garbage, they do not fault). */
static int check_cpu(Mctx* c, int root, const char* tname) {
  (void)root;
  const char* sve = strstr(tname, "sve");
  if (!sve) return LCMAC_OK;
  if (!(getauxval(AT_HWCAP) & HWCAP_SVE))
    return mfail(c, LCMAC_ETARGET, "this CPU has no SVE, so it cannot run code built for %s; "
                 "rebuild for aarch64-neon", tname);
  int vl = prctl(PR_SVE_GET_VL, 0, 0, 0, 0);
  long bits = vl < 0 ? 0 : (long)(vl & PR_SVE_VL_LEN_MASK) * 8, need = atol(sve + 3);
  if (bits && !need && (bits & (bits - 1)))
    return mfail(c, LCMAC_ETARGET, "this CPU's SVE vectors are %ld bits, not a power of two, "
                 "which %s code assumes; rebuild for aarch64-neon or aarch64-sve256", bits, tname);
  if (bits && need > bits)
    return mfail(c, LCMAC_ETARGET, "%s code needs SVE vectors of at least %ld bits and this "
                 "CPU's are %ld; rebuild for aarch64-sve", tname, need, bits);
  return LCMAC_OK;
}
#else
static int check_cpu(Mctx* c, int root, const char* tname) {
  (void)c; (void)root; (void)tname;
  return LCMAC_OK;
}
#endif

/* A CUDA artifact's arch (target.dict.arch) and recorded workspace (extra.workspace_bytes). */
static int cuda_fields(Mctx* c, int t, ArtifactInfo* a) {
  int td = mfield(c, t, "dict", "target.dict", LJ_OBJECT, 0);
  if (td < 0 || mstring(c, td, "arch", "target.dict.arch", a->arch, sizeof a->arch))
    return LCMAC_EFORMAT;
  a->ws_bytes = -1;
  int extra = mfield(c, 0, "extra", "extra", LJ_OBJECT, 1);
  if (extra == -2) return LCMAC_EFORMAT;
  if (extra >= 0 && lj_get(c->d, extra, "workspace_bytes") != -1 &&
      minteger(c, extra, "workspace_bytes", "extra.workspace_bytes", 0, &a->ws_bytes))
    return LCMAC_EFORMAT;
  return LCMAC_OK;
}

/* The artifact is what the caller opens: CPU code for this machine's architecture whose
 * features this CPU has (lcmac_open_artifact), or CUDA code (lcmac_open_cuda_artifact; the
 * GPU is checked after the library file, by check_gpu). */
static int check_target(Mctx* c, ArtifactInfo* a) {
  char backend[32], family[32], tname[64];
  int t = mfield(c, 0, "target", "target", LJ_OBJECT, 0);
  if (mstring(c, 0, "backend", "backend", backend, sizeof backend) || t < 0 ||
      mstring(c, t, "family", "target.family", family, sizeof family) ||
      mstring(c, t, "name", "target.name", tname, sizeof tname))
    return LCMAC_EFORMAT;
  int is_cuda = !strcmp(backend, "tilelang") && !strcmp(family, "cuda");
  if (a->cuda && !is_cuda)
    return mfail(c, LCMAC_ETARGET, "the artifact is %s code (target %s, backend %s), not CUDA "
                 "code; open it with lcmac_open_artifact", family_name(family), tname, backend);
  if (a->cuda) return cuda_fields(c, t, a);
  if (is_cuda)
    return mfail(c, LCMAC_ETARGET, "the artifact is CUDA code (target %s): open it with "
                 "lcmac_open_cuda_artifact and a device", tname);
  if (strcmp(backend, "tvm") || strcmp(family, LCMAC_HOST_FAMILY))
    return mfail(c, LCMAC_ETARGET, "the artifact is %s code (target %s, backend %s) and this "
                 "machine is %s; this API runs CPU artifacts built for the machine it runs on",
                 family_name(family), tname, backend, machine_name(LCMAC_HOST_EM));
  return check_cpu(c, 0, tname);
}

/* A CPU artifact's prepared-B buffer (extra.prepared_b: shape [R, S], dtype), in bytes:
 * a->prep_bytes, -1 when the manifest names none (built by an older lcmac). */
static int prepared_fields(Mctx* c, ArtifactInfo* a) {
  a->prep_bytes = -1;
  int extra = mfield(c, 0, "extra", "extra", LJ_OBJECT, 1);
  if (extra == -2) return LCMAC_EFORMAT;
  int pb = extra >= 0 ? mfield(c, extra, "prepared_b", "extra.prepared_b", LJ_OBJECT, 1) : -1;
  if (pb == -2) return LCMAC_EFORMAT;
  if (pb < 0) return LCMAC_OK;
  char dt[16];
  int shape = mfield(c, pb, "shape", "extra.prepared_b.shape", LJ_ARRAY, 0);
  if (shape < 0 || mstring(c, pb, "dtype", "extra.prepared_b.dtype", dt, sizeof dt))
    return LCMAC_EFORMAT;
  int64_t item = !strcmp(dt, "float64") ? 8 : !strcmp(dt, "float32") || !strcmp(dt, "int32") ? 4 : 0;
  if (!item) return mfail(c, LCMAC_EFORMAT, "extra.prepared_b.dtype %s is none this library knows", dt);
  a->prep_code = strcmp(dt, "int32") ? 2 : 0;     /* kDLFloat, kDLInt */
  a->prep_bits = (int)item * 8;
  int64_t bytes = item;
  for (int k = 0; k < 2; ++k) {
    int64_t e;
    int node = lj_at(c->d, shape, k);
    if (node < 0 || lj_int(c->d, node, &e) || e < 1 || e > ((int64_t)1 << 40) / bytes)
      return mfail(c, LCMAC_EFORMAT, "extra.prepared_b.shape is not two positive integers");
    bytes *= e;
    a->prep_shape[k] = e;
  }
  a->prep_bytes = bytes;
  return LCMAC_OK;
}

/* A piece kernel (entry kind "matmul_piece"): a->piece, and from extra.piece the multiples
 * its run-time rows and depth take ("rows"/"depth": {max, multiple_of}; absent: fixed). */
static int piece_fields(Mctx* c, int entry, ArtifactInfo* a) {
  char kind[32];
  if (lj_get(c->d, entry, "kind") < 0) return LCMAC_OK;
  if (mstring(c, entry, "kind", "entry_points[0].kind", kind, sizeof kind)) return LCMAC_EFORMAT;
  if (!(a->piece = !strcmp(kind, "matmul_piece"))) return LCMAC_OK;
  int extra = mfield(c, 0, "extra", "extra", LJ_OBJECT, 1);
  int pc = extra >= 0 ? mfield(c, extra, "piece", "extra.piece", LJ_OBJECT, 1) : extra;
  if (pc == -2) return LCMAC_EFORMAT;
  const char* keys[2] = {"rows", "depth"};
  int64_t most[2] = {a->M, a->K};
  for (int j = 0; j < 2 && pc >= 0; ++j) {
    char name[64];
    int64_t max;
    snprintf(name, sizeof name, "extra.piece.%s", keys[j]);
    int o = mfield(c, pc, keys[j], name, LJ_OBJECT, 1);
    if (o == -2) return LCMAC_EFORMAT;
    if (o < 0) continue;
    if (minteger(c, o, "max", name, 1, &max) ||
        minteger(c, o, "multiple_of", name, 1, &a->piece_units[j]))
      return LCMAC_EFORMAT;
    if (max != most[j] || most[j] % a->piece_units[j])
      return mfail(c, LCMAC_EFORMAT, "%s is {max %lld, multiple_of %lld}, which does not fit the "
                   "shape's %lld", name, (long long)max, (long long)a->piece_units[j],
                   (long long)most[j]);
  }
  return LCMAC_OK;
}

/* The fields lcmac_open_artifact uses, checked; then the target. */
static int manifest_fields(Mctx* c, ArtifactInfo* a) {
  const lj_doc* d = c->d;
  char fmt[64], dt[32], file[PATH_MAX], real[PATH_MAX];
  if (lj_kind(d, 0) != LJ_OBJECT)
    return mfail(c, LCMAC_EFORMAT, "not a JSON object, so not an lcmac artifact manifest");
  if (mstring(c, 0, "format", "format", fmt, sizeof fmt)) return LCMAC_EFORMAT;
  if (strcmp(fmt, LCMAC_FORMAT))
    return mfail(c, LCMAC_EFORMAT, "format %s is not %s, the one this library reads (%s)", fmt,
                 LCMAC_FORMAT, strncmp(fmt, "lcmac-artifact/", 15) ? "not an lcmac artifact"
                 : "written by another lcmac version: rebuild it, or use the lcmac that built it");
  if (mstring(c, 0, "dtype", "dtype", dt, sizeof dt)) return LCMAC_EFORMAT;
  if ((a->dtype = dtype_code(dt)) < 0)
    return mfail(c, LCMAC_EFORMAT, "dtype %s is none that this library knows", dt);
  int s = mfield(c, 0, "shape", "shape", LJ_OBJECT, 0);
  if (s < 0 || minteger(c, s, "M", "shape.M", 1, &a->M) || minteger(c, s, "N", "shape.N", 1, &a->N) ||
      minteger(c, s, "K", "shape.K", 1, &a->K))
    return LCMAC_EFORMAT;
  int ep = mfield(c, 0, "entry_points", "entry_points", LJ_ARRAY, 0);
  if (ep < 0) return LCMAC_EFORMAT;
  if (lj_kind(d, lj_at(d, ep, 0)) != LJ_OBJECT)
    return mfail(c, LCMAC_EFORMAT, "\"entry_points\" does not start with an object");
  if (mstring(c, lj_at(d, ep, 0), "name", "entry_points[0].name", a->entry, sizeof a->entry))
    return LCMAC_EFORMAT;
  static const char ident[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_";
  if (!a->entry[0] || a->entry[strspn(a->entry, ident)])
    return mfail(c, LCMAC_EFORMAT, "entry_points[0].name %s is not a C identifier", a->entry);
  if (!a->cuda && piece_fields(c, lj_at(d, ep, 0), a)) return LCMAC_EFORMAT;
  int lib = mfield(c, 0, "library", "library", LJ_OBJECT, 0);
  if (lib < 0 || mstring(c, lib, "file", "library.file", file, sizeof file) ||
      mstring(c, lib, "sha256", "library.sha256", a->sha256, sizeof a->sha256))
    return LCMAC_EFORMAT;
  if (strlen(a->sha256) != 64 || a->sha256[strspn(a->sha256, "0123456789abcdef")])
    return mfail(c, LCMAC_EFORMAT, "library.sha256 is not 64 lowercase hex digits");
  a->bytes = -1;   /* optional, as in lcmac.load */
  if (lj_get(d, lib, "bytes") != -1 && minteger(c, lib, "bytes", "library.bytes", 0, &a->bytes))
    return LCMAC_EFORMAT;
  if (!file[0]) return mfail(c, LCMAC_EFORMAT, "library.file is empty");
  /* relative to the manifest's own directory, symbolic links resolved (as lcmac.load) */
  if (file[0] == '/') {
    snprintf(a->lib, sizeof a->lib, "%s", file);
  } else {
    if (!realpath(c->path, real)) return mfail(c, LCMAC_EIO, "%s", strerror(errno));
    *strrchr(real, '/') = 0;
    if ((size_t)snprintf(a->lib, sizeof a->lib, "%s/%s", real, file) >= sizeof a->lib)
      return mfail(c, LCMAC_EFORMAT, "the library's path is too long");
  }
  int rc = check_target(c, a);
  return rc || a->cuda ? rc : prepared_fields(c, a);
}

static int read_manifest(const char* who, const char* path, ArtifactInfo* a, char* err,
                         size_t errlen) {
  char* text = NULL;
  size_t n = 0;
  int e = read_file(path, LCMAC_MANIFEST_MAX, &text, &n);
  if (e) {
    put_err(err, errlen, "%s: cannot read the manifest %s: %s (an artifact is <name>.so plus "
            "<name>.json, written by `lcmac build`)", who, path,
            e == EFBIG ? "too large for a manifest" : strerror(e));
    return e == EFBIG ? LCMAC_EFORMAT : LCMAC_EIO;
  }
  lj_doc d;
  memset(&d, 0, sizeof d);
  Mctx c = {&d, who, path, err, errlen};
  int rc;
  if (n >= 4 && !memcmp(text, "\177ELF", 4))
    rc = mfail(&c, LCMAC_EFORMAT, "this is a shared library: pass the <name>.json beside it");
  else if (lj_parse(&d, text, n))
    rc = mfail(&c, LCMAC_EFORMAT, "%s", d.err);
  else
    rc = manifest_fields(&c, a);
  lj_free(&d);
  free(text);
  return rc;
}
